"""Dagster definitions of the mirror area (loaded by load_from_defs_folder)."""
