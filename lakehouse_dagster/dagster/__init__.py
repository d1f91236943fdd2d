"""Dagster glue only: the code location (definitions.py), what its defs share (partitions, tags, refusals), and defs/ by domain."""
