"""Stopping a Dagster process tree by its process group without cutting its last console lines (Linux's /proc).

A Dagster step copies its console output through a ``tail -F`` of its compute log file, with a ``watch_orphans``
process beside it (dagster/_core/execution/compute_logs.py); the step ends both itself. A SIGTERM sent to a whole
process group kills that ``tail`` at once, so whatever the step prints after the signal — a stream run's hand-over
line — reaches the compute log but never the console. ``terminate_group`` signals every member but those two;
they go when their step ends (or with the SIGKILL that ends every stop).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def group_members(pgid: int) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of the live processes of group ``pgid`` (empty where /proc cannot say)."""
    members: dict[int, tuple[int, str]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return members
    for entry in entries:
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            state, ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
            if int(pgrp) != pgid or state == "Z":
                continue
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue  # gone meanwhile
        members[int(entry)] = (int(ppid), cmdline.strip())
    return members


def is_log_tail(cmdline: str) -> bool:
    """A step's console copier: ``tail -F -c +0 <compute log>`` or its ``watch_orphans.py`` guard."""
    return cmdline.startswith("tail -F ") or "watch_orphans" in cmdline


def terminate_group(pgid: int, sig: int = signal.SIGTERM) -> None:
    """``sig`` to every process of group ``pgid`` but the steps' log tails; to the whole group where /proc cannot
    list it."""
    members = group_members(pgid)
    if not members:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        return
    for pid, (_, cmdline) in members.items():
        if is_log_tail(cmdline):
            continue
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
