"""Runnable trainings; each main() calls elastic_dew.runtime.prepare_process() first."""
