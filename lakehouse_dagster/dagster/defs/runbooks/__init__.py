"""Dagster definitions of the runbooks area (loaded by load_from_defs_folder)."""
