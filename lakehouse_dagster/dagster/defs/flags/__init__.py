"""Dagster definitions of the flags area (loaded by load_from_defs_folder)."""
