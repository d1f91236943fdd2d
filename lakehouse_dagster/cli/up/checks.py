"""The refusals of `lakehouse up` before its first step: the options' values, a loopback UI, free ports, one `lakehouse
up` per LAKEHOUSE_HOME.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
from pathlib import Path

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.network import is_loopback

API_PORT = 3001  # `lakehouse serve` (the live app's ML_RUNNER_URL), beside the UI's 3000
CATALOGS = ("sql", "rest")


def catalog_name(raw: str) -> str:
    """--catalog: refused in one line (argparse's own ``choices`` refusal adds the whole usage)."""
    if raw not in CATALOGS:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a catalog; use sql or rest")
    return raw


def port_number(raw: str) -> int:

    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (1-65535)")
    return value


def loopback_host(host: str) -> str:
    """The UI has no authentication: only loopback addresses are accepted."""
    if not is_loopback(host):
        raise BadInput(
            f"--host {host!r} is not a loopback address; the Dagster UI has no authentication, so it listens on "
            "127.0.0.1 / ::1 only (reach it from elsewhere through an SSH tunnel or an authenticating proxy)"
        )
    return host


def check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is not "in use"
        try:
            s.bind((host, port))
        except OSError as exc:
            raise BadInput(f"cannot listen on {host}:{port} ({exc.strerror}); pick another with --port") from None


def hold_home_lock(home: Path):
    """One `lakehouse up` per LAKEHOUSE_HOME: two would run two daemons on one Dagster instance."""

    home.mkdir(parents=True, exist_ok=True)
    f = open(home / ".lakehouse-up.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise BadInput(
            f"another lakehouse up (pid {holder}) is already running for {home}; stop it first, "
            "or set LAKEHOUSE_HOME to start a separate stack"
        ) from None
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    return f
