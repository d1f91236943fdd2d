"""Dagster definitions of the migration as it is: the overview asset and what turns a partition red without a run."""
