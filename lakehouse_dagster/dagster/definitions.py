"""The code location: everything under defs/ (assets, checks, sensors, schedules, jobs, resources)."""

from pathlib import Path

import dagster as dg

from lakehouse_dagster.core.arrow_memory import prefer_jemalloc

prefer_jemalloc()  # the code server, and the warm forkserver before it forks run workers (core/arrow_memory.py)


def build() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)


@dg.definitions
def defs() -> dg.Definitions:
    # A run worker forked from the warm forkserver gets the Definitions it built from this very code
    # (launcher/location.py); the code server and everything else build them here.
    from lakehouse_dagster.dagster.launcher.location import (
        preloaded,
    )  # lazy: the launcher's preload slot, read only when the location is built

    defs = preloaded()
    return defs if defs is not None else build()
