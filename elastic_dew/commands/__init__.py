"""Subcommands of the ``elastic-dew`` CLI that sit on top of the trainer."""
