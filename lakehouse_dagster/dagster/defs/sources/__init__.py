"""Dagster definitions of the sources area (loaded by load_from_defs_folder)."""
