"""The code location (lakehouse_dagster.dagster.definitions) loaded once in the warm forkserver, so a forked run worker
finds its Definitions already built instead of importing ~100 modules and scanning defs/ (≈1 s idle of each
launch, issue 11).

A preload is only ever used for the code it was built from: ``fingerprint`` (path, size, mtime of every file of
the package) is taken before the import, the launcher compares it with the files on disk before each fork and
starts a new forkserver when they differ, and the worker compares the two again after the fork (a file changed in
between: it runs the code on disk through a fresh interpreter instead). Plain Python, no dagster import at module
level: the forkserver imports this before anything of ours.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parents[2]  # lakehouse_dagster/

# Set in the forkserver by ``preload`` (inherited by every forked worker); None everywhere else.
_fingerprint: str | None = None
_definitions: Any = None
_error: str | None = None


def fingerprint(root: Path = PACKAGE_DIR) -> str:
    """Identity of the package's files as they are on disk now (~1 ms for ~120 files)."""
    h = hashlib.sha1()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:  # removed while walking: a change, and the next call sees it
                continue
            h.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def preload(import_build: Callable[[], Callable[[], Any]]) -> None:
    """In the forkserver: import the code location (``import_build`` returns its builder) and build its
    Definitions. Never raises (a broken code location must not take the forkserver down; the run that loads it
    then fails with the real error). The builder is handed in: the launcher sits below the Dagster glue."""
    global _fingerprint, _definitions, _error
    _fingerprint = fingerprint()
    try:
        defs = import_build()()
        defs.get_repository_def()  # resolved once here too (jobs, asset graph)
        _definitions = defs
    except BaseException as exc:  # noqa: BLE001 - recorded, and the worker builds from disk instead
        _error = f"{type(exc).__name__}: {exc}"


def preloaded_fingerprint() -> str | None:
    """The fingerprint of the code this process' forkserver imported (None: it imported none of it)."""
    return _fingerprint


def preloaded() -> Any:
    """The Definitions built in the forkserver, in a worker forked from it; None anywhere else."""
    return _definitions
