"""Imported by the warm forkserver only (WarmRunLauncher ``preload_location``): builds the code location once
before any fork (launcher/location.py says how a stale preload is never used)."""

from lakehouse_dagster.dagster.launcher.location import preload


def _import_build():
    # imported inside preload's guard: a broken code location is recorded, not raised in the forkserver
    from lakehouse_dagster.dagster.definitions import (
        build,
    )  # lazy: inside preload's guard: a broken location is recorded, not raised

    return build


preload(_import_build)
