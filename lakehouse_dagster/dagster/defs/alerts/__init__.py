"""Dagster definitions of the alerts (loaded by load_from_defs_folder)."""
