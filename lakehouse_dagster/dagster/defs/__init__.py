"""Dagster glue only: partitions, resources, assets, checks, sensors, schedules, jobs.

Every module here is loaded by ``load_from_defs_folder``; core logic lives outside defs/ and never imports dagster.
"""
