"""The code location: everything under defs/ (assets, checks, sensors, schedules, jobs, resources)."""

from pathlib import Path

import dagster as dg

from lakehouse_dagster.core.arrow_memory import prefer_jemalloc

prefer_jemalloc()  # the code server, and the warm forkserver before it forks run workers (core/arrow_memory.py)


def build() -> dg.Definitions:
    # Every job runs its steps in its run's own process unless it says otherwise: a step process imports the code
    # location again (~5 s each on two cores), so a four-step runbook launched from the UI took 24 s to be refused
    # where the CLI took 4 s (issue 44). Also what the UI's "Materialize" runs, which has no job of its own.
    return dg.Definitions.merge(
        dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
        dg.Definitions(executor=dg.in_process_executor),
    )


@dg.definitions
def defs() -> dg.Definitions:
    # A run worker forked from the warm forkserver gets the Definitions it built from this very code
    # (launcher/location.py); the code server and everything else build them here.
    from lakehouse_dagster.dagster.launcher.location import (
        preloaded,
    )  # lazy: the launcher's preload slot, read only when the location is built

    defs = preloaded()
    return defs if defs is not None else build()
