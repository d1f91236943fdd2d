"""Shared by the fault tests and the crash harness: run the CLI as a real process, look at files on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from pyarrow import fs as pafs

from lakehouse_dagster.core.guards import _NS_DATASET
from lakehouse_dagster.lake.storage import table_filesystem


def cli_env(failpoint: str | None = None, **extra: str) -> dict:
    env = dict(os.environ)
    env.pop("LAKEHOUSE_FAILPOINT", None)
    if failpoint:
        env["LAKEHOUSE_FAILPOINT"] = failpoint
    env.update(extra)
    return env


def default_sigint() -> None:
    # A job started in the background inherits SIGINT ignored, and Python then installs no Ctrl-C
    # handler: restore the default so a ':sigint' failpoint interrupts the child as Ctrl-C would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli_sync(
    ds_id, failpoint: str | None = None, *, chunk_rows: int = 100, timeout: float = 120
) -> subprocess.CompletedProcess:
    """`lakehouse sync --dataset <id> --json` in its own process, with a failpoint armed."""
    return subprocess.run(
        [sys.executable, "-m", "lakehouse_dagster.cli.main", "sync", "--dataset", str(ds_id), "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=default_sigint,
        env=cli_env(failpoint, LAKEHOUSE_INGEST_CHUNK_ROWS=str(chunk_rows)),
    )


def cli_sync_popen(
    ds_id, failpoint: str | None = None, *, chunk_rows: int = 100, env: dict | None = None
) -> subprocess.Popen:
    """``lakehouse sync --json`` of one dataset in its own process (SIGINT as Ctrl-C gives it); ``env``: the whole
    environment instead of this process's with the failpoint and chunk size."""
    return cli_popen(
        "sync",
        "--dataset",
        str(ds_id),
        "--json",
        env=env if env is not None else cli_env(failpoint, LAKEHOUSE_INGEST_CHUNK_ROWS=str(chunk_rows)),
    )


def cli_popen(*argv: str, env: dict) -> subprocess.Popen:
    """``lakehouse <argv>`` in its own process, as an operator runs it (SIGINT as Ctrl-C gives it), its stdout and
    stderr piped; ``env``: its whole environment."""
    return subprocess.Popen(
        [sys.executable, "-m", "lakehouse_dagster.cli.main", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
        env=env,
    )


def wait_stopped(proc: subprocess.Popen | int, timeout: float = 60, *, must: bool = True) -> bool:
    """Wait until the process has SIGSTOPped itself (a failpoint armed with :stop). False when it
    exited first (the failpoint was not on its path) and ``must`` is off."""
    pid = proc if isinstance(proc, int) else proc.pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            state = "gone"
        if state == "T":
            return True
        if state in ("Z", "gone") or (not isinstance(proc, int) and proc.poll() is not None):
            if must:
                raise AssertionError(f"process {pid} exited before reaching its failpoint")
            return False
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never stopped at its failpoint")


def terminate_lock_session(conn, dataset_id: uuid.UUID) -> int:
    """pg_terminate_backend on the session holding the dataset's G3 lock (a dead session, a live process)."""
    pids = [
        r[0]
        for r in conn.execute(
            "select pid from pg_locks where locktype = 'advisory' and granted and classid = %s::bigint::oid",
            (_NS_DATASET,),
        ).fetchall()
    ]
    assert pids, "nobody holds a dataset lock"
    for pid in pids:
        conn.execute("select pg_terminate_backend(%s)", (pid,))
    return len(pids)


def data_files_on_disk(table) -> set[str]:
    """Names of the Parquet files in the table's data directory, local or on an object store (listed through the
    table's own FileIO filesystem: its endpoint and credentials)."""
    filesystem, root = table_filesystem(table, f"{table.location()}/data")
    infos = filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    return {i.base_name for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")}


def referenced_files(table, snapshot_id: int | None = None) -> set[str]:
    """Data files referenced by one snapshot (default: every snapshot the table still lists)."""
    ids = [snapshot_id] if snapshot_id is not None else [s.snapshot_id for s in table.snapshots()]
    names: set[str] = set()
    for sid in ids:
        for task in table.scan(snapshot_id=sid).plan_files():
            names.add(task.file.file_path.rsplit("/", 1)[-1])
    return names
