"""Named failpoints for crash testing, armed by the environment variable LAKEHOUSE_FAILPOINT.

``LAKEHOUSE_FAILPOINT=<name>[:<action>][*<times>][,...]``; the action is what happens when the code
reaches ``failpoint(name)``:

  kill (default)  the process SIGKILLs itself (no cleanup runs: a crash, a pod eviction, an OOM kill)
  raise           raises FailpointError (an unexpected bug)
  oserror         raises OSError (an object-store or network I/O error: transient)
  sigint          sends itself SIGINT (Ctrl-C: KeyboardInterrupt at that point)
  sigterm         sends itself SIGTERM (a run termination)
  stop            sends itself SIGSTOP (frozen until SIGCONT: a GC pause, a swapped-out process)

``*<times>`` fires only the first N times in this process (a transient failure that a retry outlives).
Unknown names or actions are refused when the variable is read, so a typo never arms nothing.
Unarmed, a failpoint costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading

from lakehouse_dagster.core.errors import BadInput, FailpointError

ENV = "LAKEHOUSE_FAILPOINT"

# Where they are: lake/writer.py (both the mirror and the native write path), the two callers'
# bookkeeping (mirror/sync.py for the mirror, routing/write_router.py for native writes) and the source
# writers (sources/writers.py: after the first batch on both paths; after the pg path's commit); the rollout
# controller (plans/controller.py); the stream's table maintenance (mirror/stream_maintenance.py); the reverse mirror (mirror/reverse.py); complete's batches (runbooks/complete/).
POINTS = (
    "after-first-batch",  # a source writer handed its first source batch on (pg path and native path)
    "after-first-file",  # the first Parquet file of a write is closed
    "before-commit",  # every file written, nothing committed yet
    "commit-start",  # inside the catalog's commit call, before its compare-and-swap
    "in-commit",  # inside the catalog's commit call, after its compare-and-swap, before it returns
    "after-commit-before-log",  # committed; iceberg_sync_log / datasets not updated yet
    "after-log",  # committed and recorded
    "rollout-after-step",  # plans/controller.py: a plan's step rows committed, its runs not yet asked for
    "stream-maintenance",  # mirror/stream_maintenance.py: a stream's maintenance round, under the dataset's lock
    "reverse-after-copy",  # mirror/reverse.py: the rows copied into dataset_rows (append or full), nothing else yet
    "reverse-before-commit",  # mirror/reverse.py: the rows, position and record written, not committed yet
    "reverse-after-commit",  # mirror/reverse.py: committed, the dataset lock still held
    "complete-after-batch",  # runbooks/complete/: one batch of a complete's deletes committed, the next not begun
    "complete-export-after-chunk",  # runbooks/complete/: a chunk of a complete's export written, its file not whole
)
ACTIONS = ("kill", "raise", "oserror", "sigint", "sigterm", "stop")


_lock = threading.Lock()
_parsed: tuple[str | None, dict[str, tuple[str, int | None]]] = (None, {})
_fired: dict[str, int] = {}


def parse(raw: str) -> dict[str, tuple[str, int | None]]:
    """{name: (action, times or None)}; BadInput names what is wrong and what is allowed."""
    armed: dict[str, tuple[str, int | None]] = {}
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            continue
        spec, _, times_raw = item.partition("*")
        name, _, action = spec.partition(":")
        action = action or "kill"
        if name not in POINTS:
            raise BadInput(f"{ENV}: unknown failpoint {name!r}; known: {', '.join(POINTS)}")
        if action not in ACTIONS:
            raise BadInput(f"{ENV}: unknown action {action!r} for {name}; use one of {', '.join(ACTIONS)}")
        times = None
        if times_raw:
            if not times_raw.isdigit() or int(times_raw) < 1:
                raise BadInput(f"{ENV}: '*{times_raw}' after {spec} must be a positive count")
            times = int(times_raw)
        armed[name] = (action, times)
    return armed


def _armed() -> dict[str, tuple[str, int | None]]:
    global _parsed
    raw = os.environ.get(ENV) or None
    if raw == _parsed[0]:
        return _parsed[1]
    with _lock:
        _parsed = (raw, parse(raw) if raw else {})
        _fired.clear()
    return _parsed[1]


def validate() -> None:
    """Refuse a malformed LAKEHOUSE_FAILPOINT up front (BadInput), before anything is written."""
    _armed()


def is_armed(name: str) -> bool:
    return name in _armed()


def failpoint(name: str) -> None:
    """Act as LAKEHOUSE_FAILPOINT says for ``name``, or do nothing."""
    armed = _armed()
    if not armed:
        return
    if name not in POINTS:
        raise ValueError(f"failpoint {name!r} is not declared in failpoints.POINTS")
    entry = armed.get(name)
    if entry is None:
        return
    action, times = entry
    with _lock:
        count = _fired.get(name, 0)
        if times is not None and count >= times:
            return
        _fired[name] = count + 1
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "raise":
        raise FailpointError(f"failpoint {name} fired")
    elif action == "oserror":
        raise OSError(f"failpoint {name}: simulated I/O error")
    elif action == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
    elif action == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
