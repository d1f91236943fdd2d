"""Which process is a run worker: its pid plus its kernel start time, so that a recycled pid is never mistaken
for the worker (plain Python; Linux /proc, with a pid-only fallback elsewhere)."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass


def start_time(pid: int) -> int | None:
    """The process' start time in clock ticks since boot (/proc/PID/stat field 22); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc (not Linux): the pid alone identifies it
        return -1 if _pid_exists(pid) else None
    # comm (field 2) may hold spaces and parentheses: the fields after it start after the last ')'.
    rest = stat[stat.rindex(")") + 2 :].split()
    if rest[0] in ("Z", "X"):  # exited, not yet reaped: not running
        return None
    return int(rest[19])


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@dataclass(frozen=True)
class Worker:
    """A run worker as recorded in its run's tag: host, pid, start time."""

    host: str
    pid: int
    start: int | None

    @classmethod
    def of(cls, pid: int) -> Worker:
        return cls(socket.gethostname(), pid, start_time(pid))

    def dumps(self) -> str:
        return json.dumps({"host": self.host, "pid": self.pid, "start": self.start})

    @classmethod
    def loads(cls, raw: str | None) -> Worker | None:
        if not raw:
            return None
        try:
            d = json.loads(raw)
            return cls(str(d["host"]), int(d["pid"]), None if d.get("start") is None else int(d["start"]))
        except (ValueError, KeyError, TypeError):
            return None

    @property
    def local(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool:
        """Still the same running process (a pid reused by another process counts as gone)."""
        now = start_time(self.pid)
        return now is not None and (self.start is None or now == self.start)
