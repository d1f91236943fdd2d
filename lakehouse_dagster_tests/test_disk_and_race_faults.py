"""Infrastructure faults, part two (issue 32): the warehouse's disk full and a second writer host racing the catalog,
injected for real (no mocks).

Disk full: the warehouse (``LAKEHOUSE_WAREHOUSE=file://<tmpfs>``) on a tmpfs of a few MB that a filler file fills to
the byte count a test wants; a `lakehouse sync` process (or a native ingest) bigger than the space left, or a commit
frozen inside the catalog's call (``commit-start:stop``) whose new metadata file then finds the disk full. Racing
writers: a second process with its own catalog object on the same Postgres catalog commits to the table while our
`lakehouse sync` is frozen between writing its files and committing (``before-commit:stop``): table maintenance
(lake/maintenance.py, under G3), a second mirror of the dataset (G3), and a writer that takes no lock at all (an engine
on another host: only the catalog's compare-and-swap, G4, stands between it and us). After each: one line or a
correct commit on top, Postgres = Iceberg exactly once (the crash harness's oracle), the sync log true, no orphan the
sweep would not remove."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.mirror import sweep as orphan_sweep
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.testing.crash_harness import Oracle
from lakehouse_dagster.testing.faults import cli_sync_popen, data_files_on_disk, referenced_files, wait_stopped
from lakehouse_dagster.tracking import datasets

from .test_faults import _native_dataset
from .test_infra_faults import (
    CHUNK,
    SCHEMA,
    _assert_exactly_once,
    _env,
    _native_popen,
    _native_rows,
    _one_clear_line,
    _resume,
    _statuses,
    _sync_popen,
)

pytestmark = pytest.mark.slow  # a full disk and a second writer host: real processes at failpoints

DISK = "4m"  # the tmpfs: room for a table's first commits, not for what the tests then sync into it


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of DISK mounted for this test (unmounted after it); skipped, saying why, where mount is refused."""
    mnt = tmp_path / "warehouse"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the full-disk warehouse (needs root): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False, capture_output=True)


def _settings(dsn: str, root: Path, warehouse: Path) -> Settings:
    return Settings.from_env().replace(
        postgres={"dsn": dsn},
        project={"home": root / "home"},
        catalog={"warehouse": warehouse.as_uri(), "namespace": "lakehouse"},
    )


def _free(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def _fill(mnt: Path, leave: int) -> Path:
    """A filler file taking all but ``leave`` bytes of the tmpfs."""
    filler = mnt / "filler"
    want = _free(mnt) - leave
    with open(filler, "ab") as out:
        while want > 0:
            chunk = min(want, 1 << 20)
            try:
                out.write(b"\0" * chunk)
                out.flush()
            except OSError:  # ENOSPC: full is what was asked for
                break
            want -= chunk
    return filler


def _rows(conn, d, start: int, count: int) -> None:
    """Rows whose strings do not compress (md5 hex): a file's size follows its rows."""
    conn.execute(
        "insert into dataset_rows (dataset_id, row_index, data) select %s, g, jsonb_build_object('n', g, 's',"
        " md5(random()::text) || md5(random()::text)) from generate_series(%s::int, %s::int) g",
        (d, start, start + count - 1),
    )


def _dataset(dsn: str, rows: int) -> uuid.UUID:
    with connect(dsn) as conn:
        ws = datasets.create_workspace(conn, "w")
        d = datasets.create_dataset(conn, ws, f"d{uuid.uuid4().hex[:6]}", SCHEMA)
        _rows(conn, d, 0, rows)
    return d


def _cli_sync(settings: Settings, dsn: str, d, failpoint: str | None = None) -> tuple[int, str]:
    proc = _sync_popen(settings, dsn, d, failpoint)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _sync_here(settings: Settings, dsn: str, d) -> None:
    """A clean sync in this process (a setup step: no process start)."""
    sync_dataset(dsn, load_catalog(settings, dsn), settings.replace(sync={"chunk_rows": CHUNK}), d)


def _table(settings: Settings, dsn: str, d):
    return load_catalog(settings, dsn).load_table(table_identifier(settings, d))


def _disk_full_line(err: str, where: Path) -> str:
    line = _one_clear_line(err)
    assert "the warehouse's disk is full (ENOSPC" in line, line
    assert str(where) in line and "nothing was committed" in line and "free space" in line, line
    return line


# --- 1. the warehouse's disk full ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "chunk", "leave"),
    [
        (6_000, CHUNK, 100_000),  # ~12 files of ~20 KB: a few fit, a file's close (its one flush) fails
        (40_000, 100_000, 1_200_000),  # one file of ~1.7 MB: its first 1 MB flush fits, a later write fails
    ],
    ids=["files-fail-on-close", "a-file-fails-mid-write"],
)
def test_a_sync_bigger_than_the_free_space_fails_in_one_line_commits_nothing_and_lands_once_space_is_freed(
    dsn, small_disk, tmp_path, rows, chunk, leave
):
    """pyiceberg buffers a file's output (1 MB): a file smaller than that hits ENOSPC when it is closed, a bigger
    one while it is still being written (left open, and its close fails again)."""
    settings = _settings(dsn, tmp_path, small_disk)
    d = _dataset(dsn, 200)
    _sync_here(settings, dsn, d)
    before = _table(settings, dsn, d)
    with connect(dsn) as conn:
        _rows(conn, d, 200, rows)
    filler = _fill(small_disk, leave)
    proc = cli_sync_popen(d, env={**_env(settings, dsn), "LAKEHOUSE_INGEST_CHUNK_ROWS": str(chunk)})
    _, err = proc.communicate(timeout=120)
    code = proc.returncode
    assert code == 75, err  # try again (docs/operator-guide.md, exit codes): nothing committed, nothing lost
    _disk_full_line(err, small_disk)
    after = _table(settings, dsn, d)
    assert after.metadata_location == before.metadata_location  # no commit, not even a metadata file swapped in
    assert [s.snapshot_id for s in after.snapshots()] == [s.snapshot_id for s in before.snapshots()]
    assert data_files_on_disk(after) == referenced_files(after)  # the failed sync removed the files it wrote
    with connect(dsn) as conn:
        assert _statuses(conn, d) == ["succeeded", "failed"]  # not left 'running'
        [listed] = orphan_sweep.sweep(conn, load_catalog(settings, dsn), settings, [d], delete=False, grace_seconds=0)
        assert listed.orphans == [] and listed.error is None, listed
    filler.unlink()
    code, err = _cli_sync(settings, dsn, d)
    assert code == 0, err
    _assert_exactly_once(dsn, settings, d)


def test_a_first_sync_on_a_full_disk_creates_no_table_and_says_so_in_one_line(dsn, small_disk, tmp_path):
    """The table's creation (its first metadata file) is what fails: no table in the catalog, one line, exit 75."""
    settings = _settings(dsn, tmp_path, small_disk)
    d = _dataset(dsn, 100)
    filler = _fill(small_disk, 0)
    code, err = _cli_sync(settings, dsn, d)
    assert code == 75, err
    _disk_full_line(err, small_disk)
    assert not load_catalog(settings, dsn).table_exists(table_identifier(settings, d))
    with connect(dsn) as conn:
        assert _statuses(conn, d) == ["failed"]
    filler.unlink()
    code, err = _cli_sync(settings, dsn, d)
    assert code == 0, err
    _assert_exactly_once(dsn, settings, d)


def test_the_metadata_file_failing_on_a_full_disk_leaves_the_catalog_on_its_last_whole_metadata(
    dsn, small_disk, tmp_path
):
    """The disk fills while a commit is inside the catalog's call (``commit-start``: its manifests written, its new
    metadata.json not yet): the metadata write fails, the catalog still points at the last metadata file, whole; the
    sync says so in one line and removes its data files; the sweep takes the commit's manifests and the empty
    metadata file it left; once space is freed the next sync lands exactly once."""
    settings = _settings(dsn, tmp_path, small_disk)
    d = _dataset(dsn, 200)
    _sync_here(settings, dsn, d)
    before = _table(settings, dsn, d)
    with connect(dsn) as conn:
        _rows(conn, d, 200, 300)
    proc = _sync_popen(settings, dsn, d, "commit-start:stop")
    wait_stopped(proc, 60)
    filler = _fill(small_disk, 0)
    assert _free(small_disk) == 0
    code, err = _resume(proc)
    assert code == 75, err
    _disk_full_line(err, small_disk)
    after = _table(settings, dsn, d)  # loads: the pointer names a whole file
    assert after.metadata_location == before.metadata_location
    assert after.current_snapshot().snapshot_id == before.current_snapshot().snapshot_id
    assert Path(after.metadata_location.removeprefix("file://")).stat().st_size > 0
    metadata_dir = Path(after.location().removeprefix("file://")) / "metadata"
    assert [p for p in metadata_dir.glob("*.metadata.json") if p.stat().st_size == 0]  # the failed write's own file
    assert data_files_on_disk(after) == referenced_files(after)
    with connect(dsn) as conn:
        assert _statuses(conn, d) == ["succeeded", "failed"]
    filler.unlink()
    code, err = _cli_sync(settings, dsn, d)
    assert code == 0, err
    _assert_exactly_once(dsn, settings, d)  # the sweep there removes the failed commit's manifests, empty metadata
    assert not [p for p in metadata_dir.glob("*.metadata.json") if p.stat().st_size == 0]


def test_a_native_ingest_on_a_full_disk_lands_all_rows_or_none_with_a_clear_message(dsn, small_disk, tmp_path):
    settings = _settings(dsn, tmp_path, small_disk)
    with connect(dsn) as conn:
        d = _native_dataset(conn)
    first = _native_popen(settings, dsn, d, 0, 10)
    assert first.communicate(timeout=120) and first.returncode == 0
    filler = _fill(small_disk, 60_000)
    full = _native_popen(settings, dsn, d, 10, 20_000)  # ~40 files of CHUNK rows: a few fit
    _, err = full.communicate(timeout=120)
    assert full.returncode != 0
    last = err.strip().splitlines()[-1]  # a script: the exception's own line is what its caller logs
    assert last.startswith("lakehouse_dagster.core.errors.DiskFull:"), err
    assert "the warehouse's disk is full (ENOSPC" in last and str(small_disk) in last, last
    assert _native_rows(settings, dsn, d) == list(range(10))  # none of it
    t = _table(settings, dsn, d)
    assert data_files_on_disk(t) == referenced_files(t)
    with connect(dsn) as conn:
        assert _statuses(conn, d) == ["succeeded", "failed"]
    filler.unlink()
    retry = _native_popen(settings, dsn, d, 10, 20_000)
    _, err = retry.communicate(timeout=120)
    assert retry.returncode == 0, err
    assert _native_rows(settings, dsn, d) == list(range(20_010))  # all of it, once
    t = _table(settings, dsn, d)
    assert data_files_on_disk(t) == referenced_files(t)


# --- 2. a second writer host racing the catalog ----------------------------------------------------------

# Another host: its own process, its own catalog object, the same Postgres catalog. ``compact``/``expire`` run table
# maintenance (lake/maintenance.py: under G3, waiting ``timeout`` seconds for it); ``foreign-compact`` rewrites the
# table's files with the same rows and takes no lock (an engine elsewhere: only the catalog's compare-and-swap).
OTHER_HOST = """
import sys, uuid
from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake import maintenance
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.lake.reader import read_files
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.lake.writer import SOURCE_VERSION, TableWrite, write_arrow
from lakehouse_dagster.tracking.datasets import get_dataset
s = Settings.from_env()
what, d, timeout = sys.argv[1], uuid.UUID(sys.argv[2]), float(sys.argv[3])
catalog = load_catalog(s, s.postgres.dsn)
with connect(s.postgres.dsn) as conn:
    if what == "compact":
        print(maintenance.compact_small_files(conn, catalog, s, d, small_bytes=10**9, min_files=2, lock_timeout_s=timeout))
    elif what == "expire":
        print(maintenance.expire_snapshots(conn, catalog, s, d, keep=0, older_than_seconds=0, pin_seconds=0,
                                           lock_timeout_s=timeout))
    else:
        table = catalog.load_table(table_identifier(s, d))
        files = [t.file for t in table.scan().plan_files()]
        target = arrow_schema(get_dataset(conn, d).columns)
        plan = TableWrite(mode="partial", sync_id=uuid.uuid4(), source_version=int(table.properties[SOURCE_VERSION]),
                          path="mirror", delete_files=files)
        r = write_arrow(catalog, s, get_dataset(conn, d), read_files(table, [f.file_path for f in files], target), plan,
                        table=table)
        print("rewrote", len(files), "files into", r.files, "snapshot", r.snapshot_id)
"""


def _other_host(settings: Settings, dsn: str, what: str, d, timeout: float = 60) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", OTHER_HOST, what, str(d), str(timeout)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(settings, dsn),
    )


def _wait_for_lock_waiter(dsn: str, timeout: float = 30) -> None:
    """Until a session waits for an advisory lock (the other host queued behind our frozen sync's G3)."""
    deadline = time.monotonic() + timeout
    with connect(dsn) as conn:
        while (
            conn.execute("select count(*) from pg_locks where locktype = 'advisory' and not granted").fetchone()[0] == 0
        ):
            assert time.monotonic() < deadline, "nobody waited for the dataset lock"
            time.sleep(0.05)


def _snapshot_ids(settings: Settings, dsn: str, d) -> list[int]:
    return [s.snapshot_id for s in _table(settings, dsn, d).snapshots()]


def _small_files_table(settings: Settings, dsn: str, d, syncs: int = 3) -> None:
    """A table of several small files (a first sync, then small appends, a file each)."""
    _sync_here(settings, dsn, d)
    with connect(dsn) as conn:
        for i in range(syncs):
            _rows(conn, d, 1_000 + i * 50, 50)
            conn.commit()
            _sync_here(settings, dsn, d)
    assert len(referenced_files(_table(settings, dsn, d), _snapshot_ids(settings, dsn, d)[-1])) >= 2


@pytest.fixture
def warehouse(dsn, tmp_path) -> Settings:
    (tmp_path / "warehouse").mkdir()
    return _settings(dsn, tmp_path, tmp_path / "warehouse")


@pytest.mark.parametrize("what", ["compact", "expire"])
def test_table_maintenance_from_another_host_waits_for_a_frozen_sync_and_commits_after_it(dsn, warehouse, what):
    """G3 serialises maintenance with a sync: another host's compaction or expiry, with a short lock wait, is refused
    (LockTimeout, nothing committed); with a long one it waits, and commits on top of the sync once that resumed."""
    settings = warehouse
    d = _dataset(dsn, 1_000)
    _small_files_table(settings, dsn, d)
    with connect(dsn) as conn:
        _rows(conn, d, 2_000, 300)
    before = _snapshot_ids(settings, dsn, d)
    proc = _sync_popen(settings, dsn, d, "before-commit:stop")
    wait_stopped(proc, 60)
    refused = _other_host(settings, dsn, what, d, timeout=1)
    _, err = refused.communicate(timeout=60)
    assert refused.returncode != 0 and "LockTimeout" in err and "held the lock" in err, err
    assert _snapshot_ids(settings, dsn, d) == before
    waiting = _other_host(settings, dsn, what, d, timeout=60)
    _wait_for_lock_waiter(dsn)
    code, err = _resume(proc)
    assert code == 0, err
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    t = _table(settings, dsn, d)
    with connect(dsn) as conn:
        sync_snapshot = conn.execute(
            "select snapshot_id from iceberg_sync_log where dataset_id = %s order by started_at desc limit 1", (d,)
        ).fetchone()[0]
    if what == "compact":
        assert "skipped=None" in out, out
        assert t.current_snapshot().parent_snapshot_id == sync_snapshot  # the compaction on top of the sync
        assert len(referenced_files(t, t.current_snapshot().snapshot_id)) < len(referenced_files(t, sync_snapshot))
    else:  # ran after the sync: it saw the sync's snapshot (fewer than 16 to keep: nothing to expire yet)
        assert f"snapshots_before={len(before) + 1}," in out, out
        assert t.current_snapshot().snapshot_id == sync_snapshot
    _assert_exactly_once(dsn, settings, d)


def test_a_second_mirror_of_the_same_dataset_waits_for_the_first_and_never_commits_twice(dsn, warehouse):
    settings = warehouse
    d = _dataset(dsn, 1_000)
    _sync_here(settings, dsn, d)
    with connect(dsn) as conn:
        _rows(conn, d, 1_000, 300)
    before = _snapshot_ids(settings, dsn, d)
    first = _sync_popen(settings, dsn, d, "before-commit:stop")
    wait_stopped(first, 60)
    second = _sync_popen(settings, dsn, d)  # another host, the same dataset
    _wait_for_lock_waiter(dsn)
    assert second.poll() is None  # waiting on G3, not writing
    code, err = _resume(first)
    assert code == 0, err
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert '"mode": "noop"' in out, out  # it found the rows mirrored: nothing written a second time
    assert len(_snapshot_ids(settings, dsn, d)) == len(before) + 1  # one commit for the 300 rows
    with connect(dsn) as conn:
        assert _statuses(conn, d) == ["succeeded"] * 3
    _assert_exactly_once(dsn, settings, d)


@pytest.mark.parametrize("change", ["append", "update-full", "update-partial"])
def test_a_lockless_writer_rewriting_the_files_under_a_frozen_sync_loses_and_duplicates_nothing(dsn, warehouse, change):
    """A writer that takes no lock (an engine on another host) rewrites every data file of the table (same rows) while
    our sync is frozen with its files written; our commit then loses the compare-and-swap. An append, or a full
    rewrite: G4 commits it again on the table as it is now (the full one re-plans which files it removes). A partial
    rewrite (its commit deletes the files that held the changed rows): those files are gone, so the commit is refused
    as planned on a stale snapshot, the sync fails in one line and removes its files, and the next sync plans on the
    table as it is. Every row exactly once, whichever."""
    settings = warehouse
    d = _dataset(dsn, 1_000)
    _small_files_table(settings, dsn, d)
    with connect(dsn) as conn:
        if change == "append":
            _rows(conn, d, 2_000, 300)
        else:
            conn.execute(
                "update dataset_rows set data = jsonb_set(data, '{s}', '\"changed\"') where dataset_id = %s"
                " and row_index between 100 and 120",
                (d,),
            )
    fraction = "0.9" if change == "update-partial" else "0.25"  # 1 file of 500 rows among 1,150: partial only at 0.9
    env = {**_env(settings, dsn, "before-commit:stop"), "LAKEHOUSE_PARTIAL_MAX_FRACTION": fraction}
    proc = cli_sync_popen(d, env=env)
    wait_stopped(proc, 60)
    other = _other_host(settings, dsn, "foreign-compact", d)
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0 and out.startswith("rewrote"), err
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    with connect(dsn) as conn:
        statuses = _statuses(conn, d)
    if change != "update-partial":
        assert proc.returncode == 0, err
        assert f'"mode": "{"incremental" if change == "append" else "full"}"' in out, out
        assert statuses[-1] == "succeeded"
    else:
        assert proc.returncode == 75, err  # refused as stale: the next sync reconciles (try again)
        line = _one_clear_line(err)
        assert "no longer in the table" in line and "stale snapshot" in line, line
        assert statuses[-1] == "failed"
        t = _table(settings, dsn, d)
        assert data_files_on_disk(t) == referenced_files(t)  # its files removed
        code, err = _cli_sync(settings, dsn, d)
        assert code == 0, err
    _assert_exactly_once(dsn, settings, d)


FOREIGN_EXPIRE = """
import sys, uuid
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
s = Settings.from_env()
table = load_catalog(s, s.postgres.dsn).load_table(table_identifier(s, uuid.UUID(sys.argv[1])))
oldest = [snap.snapshot_id for snap in sorted(table.snapshots(), key=lambda x: x.timestamp_ms)][: int(sys.argv[2])]
table.maintenance.expire_snapshots().by_ids(oldest).commit()
print("expired", len(oldest))
"""


def test_a_lockless_expiry_of_the_snapshots_a_frozen_sync_also_expires_does_not_fail_the_sync(dsn, warehouse):
    """Our sync's commit also expires its table's oldest snapshots (LAKEHOUSE_SNAPSHOTS_KEEP past, older than
    LAKEHOUSE_SNAPSHOTS_MAX_AGE_SECONDS); another host, taking no lock, expires the same ones while our sync is frozen.
    The catalog applies our commit to the table as it is now, where those snapshots are gone: the commit is refused
    as a conflict would be, and G4 commits it again on that table; it lands, once."""
    settings = warehouse
    d = _dataset(dsn, 100)
    with connect(dsn) as conn:
        _sync_here(settings, dsn, d)
        for i in range(17):  # 18 snapshots; none expired (none older than the default hour)
            _rows(conn, d, 100 + i * 10, 10)
            conn.commit()
            _sync_here(settings, dsn, d)
        _rows(conn, d, 1_000, 100)
    before = _snapshot_ids(settings, dsn, d)
    assert len(before) == 18
    env = {
        **_env(settings, dsn, "before-commit:stop"),
        "LAKEHOUSE_SNAPSHOTS_KEEP": "16",
        "LAKEHOUSE_SNAPSHOTS_MAX_AGE_SECONDS": "0",
    }
    proc = cli_sync_popen(d, env=env)  # its commit: the new snapshot, and the oldest three expired
    wait_stopped(proc, 60)
    other = subprocess.run(
        [sys.executable, "-c", FOREIGN_EXPIRE, str(d), "3"], capture_output=True, text=True, env=_env(settings, dsn)
    )
    assert other.returncode == 0, other.stderr
    assert len(_snapshot_ids(settings, dsn, d)) == 15
    code, err = _resume(proc)
    assert code == 0, err
    after = _snapshot_ids(settings, dsn, d)
    assert len(after) == 16  # 18 - the other host's 3 + ours; its retry found nothing left past the 16 to expire
    gone = set(before) - set(after)
    assert len(gone) == 3
    with connect(dsn) as conn:
        bad = Oracle(dsn, settings).after_clean_sync(conn, d)
        # the oracle wants every succeeded sync's snapshot in the table: these were expired, as asked
        assert [b for b in bad if not any(f"names snapshot {x}, not in the table" in b for x in gone)] == [], bad
        assert len(bad) == len(gone)
        [swept] = orphan_sweep.sweep(conn, load_catalog(settings, dsn), settings, [d], delete=True, grace_seconds=0)
        assert swept.error is None and swept.removed == len(swept.orphans), swept
        assert _statuses(conn, d) == ["succeeded"] * 19
    t = _table(settings, dsn, d)
    assert sorted(t.scan().to_arrow()["n"].to_pylist()) == list(range(270)) + list(range(1_000, 1_100))
