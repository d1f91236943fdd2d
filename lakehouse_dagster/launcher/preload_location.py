"""Imported by the warm forkserver only (WarmRunLauncher ``preload_location``): builds the code location once
before any fork (location.py says how a stale preload is never used)."""

from .location import preload

preload()
