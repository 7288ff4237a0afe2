"""Runnable trainings; each main() runs the recipe through elastic_dew.console (the options of elastic-dew train)."""
