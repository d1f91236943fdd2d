"""Dagster definitions of the parity area (loaded by load_from_defs_folder)."""
