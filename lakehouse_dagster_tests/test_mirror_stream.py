"""The mirror as a stream (mirror/stream.py, the mirror_stream job, the poller's supervision): real Postgres, real
Iceberg tables, real Dagster runs. Postgres equal to Iceberg is judged by the parity digest (a full cross-check)."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags import set_override
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.mirror.batch import Failed
from lakehouse_dagster.mirror.stream import Idle, shard_of, stream_shard
from lakehouse_dagster.mirror.stream_maintenance import Maintained
from lakehouse_dagster.mirror.sync import SyncResult
from lakehouse_dagster.parity import canary
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]


class Stream:
    """One stream_shard loop in a thread, as a stream run runs it; ``events`` are what it yielded."""

    def __init__(self, settings, dsn, *, shard=0, count=1, seconds=60.0, run_id=None, wait_until=None, **kw):
        self.stop = threading.Event()
        self.events: list = []
        self.run_id = run_id or f"stream-test-{uuid.uuid4().hex[:8]}"
        self.error: BaseException | None = None
        self.held = threading.Event()
        deadline = time.time() + seconds

        def body():
            try:
                for e in stream_shard(
                    dsn,
                    load_catalog(settings, dsn),
                    settings,
                    shard=shard,
                    shard_count=count,
                    run_id=self.run_id,
                    deadline=deadline,
                    wait_until=wait_until,
                    stop=self.stop,
                    on_lease=lambda lease: self.held.set(),
                    **kw,
                ):
                    if not isinstance(e, Idle):
                        self.events.append(e)
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                import traceback

                traceback.print_exc()
                self.error = exc

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def synced(self) -> list[SyncResult]:
        return [e for e in self.events if isinstance(e, SyncResult)]

    def close(self, timeout: float = 60) -> None:
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the stream did not stop"
        assert self.error is None, self.error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _dataset(conn, ws, name, rows=5):
    d = datasets.create_dataset(conn, ws, name, SCHEMA)
    if rows:
        datasets.insert_rows(conn, d, [{"n": k, "s": f"r{k}"} for k in range(rows)])
    return d


def caught_up(conn, ids) -> bool:
    return conn.execute(
        """select count(*) = cardinality(%(ids)s::uuid[]) from datasets d
            where d.id = any(%(ids)s::uuid[]) and d.mirrored_version >= d.rows_version""",
        {"ids": list(ids)},
    ).fetchone()[0]


def wait_caught_up(conn, ids, timeout=60.0) -> float:
    t0 = time.time()
    while not caught_up(conn, ids):
        if time.time() - t0 > timeout:
            raise AssertionError(f"not mirrored within {timeout}s")
        time.sleep(0.05)
    return time.time() - t0


def _wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.05)


def assert_parity(settings, dsn, ids) -> None:
    catalog = load_catalog(settings, dsn)
    for d in ids:
        v = canary.evaluate(dsn, catalog, settings, d, full=True)
        assert v.verdict == "ok", (d, v.verdict, v.detail)


def assert_nothing_twice(conn, ids) -> None:
    """No two syncs that wrote rows covered the same source version of a dataset, and no two syncs of one dataset
    ran at the same time (G3); each table's __row_index is unique (no row landed twice)."""
    rows = conn.execute(
        """select dataset_id, source_version, mode, started_at, finished_at from iceberg_sync_log
            where dataset_id = any(%s::uuid[]) and status = 'succeeded' order by dataset_id, started_at""",
        (list(ids),),
    ).fetchall()
    by: dict = {}
    for ds, version, mode, started, finished in rows:
        by.setdefault(ds, []).append((version, mode, started, finished))
    for ds, syncs in by.items():
        written = [v for v, mode, *_ in syncs if mode != "noop"]
        assert len(written) == len(set(written)), (ds, syncs)
        for a, b in zip(syncs, syncs[1:], strict=False):
            assert a[3] <= b[2], (ds, "two syncs of one dataset overlapped", a, b)


def test_shard_of_is_stable_and_spreads():
    ids = [uuid.UUID(int=i * 7919 + 1) for i in range(400)]
    assert [shard_of(d, 4) for d in ids] == [shard_of(d, 4) for d in ids]
    counts = [sum(shard_of(d, 4) == s for d in ids) for s in range(4)]
    assert min(counts) > 60, counts  # sequential ids spread (hashed, not their leading bytes)
    assert {shard_of(d, 1) for d in ids} == {0}
    # fixed forever: a release that changed it would stream a shard from two runs at once during an upgrade
    assert shard_of(uuid.UUID("00000000-0000-0000-0000-000000000001"), 7) == shard_of(
        uuid.UUID("00000000-0000-0000-0000-000000000001"), 7
    )


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_stream_mirrors_appends_updates_and_deletes_of_several_datasets(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "w")
    ids = [_dataset(conn, ws, f"d{i}", rows=5 + i) for i in range(3)]
    with Stream(settings, dsn) as s:
        assert wait_caught_up(conn, ids) < 30  # what was behind at its start (its first sweep)
        datasets.insert_rows(conn, ids[0], [{"n": 100, "s": "appended"}])
        conn.execute(
            "update dataset_rows set data = jsonb_set(data, '{s}', '\"changed\"') where dataset_id = %s and row_index = 1",
            (ids[1],),
        )
        conn.execute("delete from dataset_rows where dataset_id = %s and row_index in (0, 2)", (ids[2],))
        assert wait_caught_up(conn, ids) < 10
        modes = {r.dataset_id: r.mode for r in s.synced() if r.mode != "noop"}
    assert_parity(settings, dsn, ids)
    assert_nothing_twice(conn, ids)
    assert modes[ids[0]] == "incremental"  # an append is an append, as in a batch run
    runs = {r[0] for r in conn.execute("select run_id from iceberg_sync_log where dataset_id = any(%s)", (ids,))}
    assert runs == {s.run_id}
    row = conn.execute(
        "select run_id, ended_at is not null, syncs, last_commit_at is not null from lakehouse_mirror_streams"
        " where shard_count = 1 and shard = 0"
    ).fetchone()
    assert row == (s.run_id, True, len(s.synced()), True)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
@pytest.mark.parametrize("share", [0.2, 1.0])
def test_a_dataset_written_without_pause_gets_at_most_its_share_of_sync_time(conn, dsn, settings, share):
    """After a sync of T seconds the dataset's next sync starts no sooner than T × (1/share − 1) later
    (LAKEHOUSE_MIRROR_SYNC_SHARE); at 1 they run back to back. Nothing is lost either way.

    Asserted on the pacing's own account (``pace_log``: the stream's clock, the sync's own T), never on the sync
    log's stamps: those are another clock, and a loaded machine stretches them (a 0.2085 s rest read against a
    0.214 s bound failed a correct program)."""
    ws = datasets.create_workspace(conn, "w")
    d = _dataset(conn, ws, "busy", rows=3000)
    pace: list = []
    with Stream(settings.replace(stream={"sync_share": share}), dsn, pace_log=pace) as s:
        wait_caught_up(conn, [d])
        # written without pause until the stream has landed three syncs of the writes (a count, not 4 s of a clock:
        # a loaded machine stretches each sync and its rest, and fit two in 4 s once)
        k, deadline = 0, time.monotonic() + 180
        while sum(1 for kind, ds, *_ in pace if kind == "landed" and ds == d) < 4:
            assert time.monotonic() < deadline, pace
            datasets.insert_rows(conn, d, [{"n": 10_000 + k, "s": "x"}])
            k += 1
            time.sleep(0.01)
        wait_caught_up(conn, [d], timeout=30)
    landed = [(at, until) for kind, ds, at, until in pace if kind == "landed" and ds == d]
    synced = [r for r in s.synced() if r.dataset_id == d]
    assert len(landed) == len(synced) >= 3, (pace, synced)
    for (at, until), r in zip(landed, synced, strict=True):  # each rest is (1/share − 1) × the sync's own T
        rest = r.seconds * (1 / share - 1)
        assert until - at == pytest.approx(rest, abs=1e-6), (at, until, r.seconds)  # epoch floats: µs apart at most
    order = [(kind, at, until) for kind, ds, at, until in pace if ds == d]
    rests = [(a, b) for a, b in zip(order, order[1:], strict=False) if a[0] == "landed" and b[0] == "started"]
    assert len(rests) >= 2, order
    assert all(started >= until for (_, _, until), (_, started, _) in rests), rests  # no start inside a rest
    if share < 1:
        assert all(until > at for at, until in landed), landed  # every sync did rest
    assert_parity(settings, dsn, [d])
    assert_nothing_twice(conn, [d])


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_two_shards_split_the_datasets(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "w")
    ids = [_dataset(conn, ws, f"d{i}") for i in range(8)]
    while {shard_of(d, 2) for d in ids} != {0, 1}:  # uuid4s: 1 in 128 times, 8 of them fall in one shard
        ids.append(_dataset(conn, ws, f"d{len(ids)}"))
    with Stream(settings, dsn, shard=0, count=2) as s0, Stream(settings, dsn, shard=1, count=2) as s1:
        wait_caught_up(conn, ids)
        for d in ids:
            datasets.insert_rows(conn, d, [{"n": 50, "s": "more"}])
        wait_caught_up(conn, ids)
    for s, shard in ((s0, 0), (s1, 1)):
        assert s.synced() and {r.dataset_id for r in s.synced()} == {d for d in ids if shard_of(d, 2) == shard}
    assert_parity(settings, dsn, ids)
    assert_nothing_twice(conn, ids)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_native_dataset_stays_refused(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "w")
    pg, native = _dataset(conn, ws, "pg"), _dataset(conn, ws, "native")
    set_override(conn, "write", "sync.full", "iceberg_native", dataset=str(native), actor="pytest", note="test")
    with Stream(settings, dsn) as s:
        wait_caught_up(conn, [pg])
        datasets.insert_rows(conn, native, [{"n": 9, "s": "late"}])  # Postgres moves: still never mirrored
        datasets.insert_rows(conn, pg, [{"n": 9, "s": "late"}])
        wait_caught_up(conn, [pg])
        time.sleep(0.5)
    assert native not in {e.dataset_id for e in s.events}
    assert conn.execute("select count(*) from iceberg_sync_log where dataset_id = %s", (native,)).fetchone()[0] == 0
    assert load_table_or_none(load_catalog(settings, dsn), table_identifier(settings, native)) is None


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_bad_row_fails_once_and_waits_for_the_backoff(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "w")
    good = _dataset(conn, ws, "good")
    bad = datasets.create_dataset(conn, ws, "bad", SCHEMA)
    datasets.insert_rows(conn, bad, [{"n": 1}, {"n": "x"}])
    with Stream(settings, dsn) as s:
        wait_caught_up(conn, [good])
        time.sleep(6)  # past a sweep: the failed dataset is not asked again before the poller's backoff
    failed = [e for e in s.events if isinstance(e, Failed)]
    assert [f.dataset_id for f in failed] == [bad]
    assert "row_index 1 column n: expected int64, got a JSON string" in str(failed[0].error)
    assert conn.execute("select status from datasets where id = %s", (bad,)).fetchone()[0] == "errored"


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_handover_with_writes_in_flight_loses_nothing_and_syncs_nothing_twice(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "w")
    ids = [_dataset(conn, ws, f"d{i}") for i in range(3)]
    stop_writing = threading.Event()
    written = {d: 5 for d in ids}

    def writer():
        from lakehouse_dagster.core.db import connect

        with connect(dsn) as c:
            k = 0
            while not stop_writing.is_set():
                d = ids[k % len(ids)]
                datasets.insert_rows(c, d, [{"n": 1000 + k, "s": f"w{k}"}])
                written[d] += 1
                k += 1
                time.sleep(0.03)

    first = Stream(settings, dsn, seconds=60.0)  # ends when stopped below (as its deadline would): no race on a clock
    assert first.held.wait(30)
    wait_caught_up(conn, ids)
    before = len(first.synced())
    w = threading.Thread(target=writer, daemon=True)
    w.start()
    _wait_for(lambda: len(first.synced()) > before, "a sync of the writes under the first stream")
    second = Stream(settings, dsn, seconds=60.0)  # started before the first ends: waits on the shard's lock
    assert not second.held.wait(1.0)  # the first still holds the shard
    first.stop.set()
    first.thread.join(30)
    assert first.error is None and not first.thread.is_alive()
    assert second.held.wait(10)
    _wait_for(lambda: second.synced(), "a sync of the writes under the second stream")  # writes go on under it
    stop_writing.set()
    w.join(10)
    wait_caught_up(conn, ids)
    second.close()
    assert first.synced() and second.synced()
    f_end = max(
        r[0] for r in conn.execute("select finished_at from iceberg_sync_log where run_id = %s", (first.run_id,))
    )
    s_start = min(
        r[0] for r in conn.execute("select started_at from iceberg_sync_log where run_id = %s", (second.run_id,))
    )
    assert f_end <= s_start  # the shard was never streamed twice at once
    assert_parity(settings, dsn, ids)
    assert_nothing_twice(conn, ids)
    for d in ids:
        assert conn.execute("select row_count from datasets where id = %s", (d,)).fetchone()[0] == written[d]


@pytest.mark.parametrize("count", [1])
def test_a_stream_whose_shard_is_held_does_not_start_before_its_wait_ends(conn, dsn, settings, count):
    with Stream(settings, dsn, count=count) as holder:
        assert holder.held.wait(30)
        late = Stream(settings, dsn, count=count, wait_until=time.time() + 1.0)
        late.thread.join(20)
        assert not late.held.is_set() and late.events == [] and late.error is None


KILLED_STREAM = """
import sys, time
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.stream import stream_shard
s = Settings.from_env()
for e in stream_shard(s.postgres.dsn, load_catalog(s, s.postgres.dsn), s, shard=0, shard_count=1, run_id=sys.argv[1],
                      deadline=time.time() + 60):
    pass
"""


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_stream_killed_mid_commit_is_replaced_and_loses_nothing(conn, dsn, settings, monkeypatch):
    """SIGKILL inside the catalog's commit (after its compare-and-swap): the shard's lock goes with the process, the
    replacement takes the shard at once, settles the killed sync (its commit landed) and mirrors the writes made
    meanwhile; nothing is lost, nothing is written twice."""
    import os
    import subprocess
    import sys

    ws = datasets.create_workspace(conn, "w")
    ids = [_dataset(conn, ws, f"d{i}") for i in range(2)]
    env = {**os.environ, "LAKEHOUSE_FAILPOINT": "in-commit:kill"}
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_STREAM, "killed-run"], env=env, timeout=120, capture_output=True, text=True
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    # killed inside a commit: its sync (and any other in flight on another worker) is left 'running'
    assert conn.execute("select count(*) from iceberg_sync_log where status = 'running'").fetchone()[0] >= 1
    row = conn.execute("select run_id, ended_at from lakehouse_mirror_streams").fetchone()
    assert row == ("killed-run", None)  # it died holding the shard: no end was written
    for d in ids:  # writes while no stream runs
        datasets.insert_rows(conn, d, [{"n": 77, "s": "meanwhile"}])
    with Stream(settings, dsn) as s:
        assert s.held.wait(10)  # the killed process' lock went with its connection
        wait_caught_up(conn, ids)
    assert conn.execute("select count(*) from iceberg_sync_log where status = 'running'").fetchone()[0] == 0
    assert_parity(settings, dsn, ids)
    assert_nothing_twice(conn, ids)
    for d in ids:
        assert conn.execute("select row_count from datasets where id = %s", (d,)).fetchone()[0] == 6


# ---------------------------------------------------------------------------------------------------
# Background table maintenance in the stream (mirror/stream_maintenance.py): a trickle through a real stream.


def _maintained_settings(monkeypatch, **extra: str) -> Settings:
    """Small maintenance limits, through the settings: a round per dataset every second, compaction from 4 small
    files, snapshots expired at any age past the newest 16 and the pins of the last second."""
    env = {
        "LAKEHOUSE_MIRROR_STREAM_MAINTENANCE_SECONDS": "1",
        "LAKEHOUSE_MAINTENANCE_MIN_FILES": "4",
        "LAKEHOUSE_MAINTENANCE_SNAPSHOT_AGE_SECONDS": "0",
        "LAKEHOUSE_MAINTENANCE_PIN_SECONDS": "1",
        "LAKEHOUSE_MIRROR_COMMIT_WINDOW_MS": "20",
        **extra,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return Settings.from_env()


def _live(catalog, settings, d) -> tuple[set[int], int]:
    """The table's live snapshot ids and live data files."""
    table = catalog.load_table(table_identifier(settings, d))
    return {s.snapshot_id for s in table.metadata.snapshots}, sum(1 for _ in table.scan().plan_files())


def _trickle(conn, d, commits: int, first: int, *, each=None) -> None:
    """One-row appends, each mirrored (its own commit) before the next."""
    for k in range(commits):
        datasets.insert_rows(conn, d, [{"n": first + k, "s": f"t{first + k}"}])
        wait_caught_up(conn, [d], timeout=30)
        if each is not None:
            each()


def _rounds(s: Stream | _StoppableRun) -> list[Maintained]:
    return [e for e in s.events if isinstance(e, Maintained)]


@pytest.mark.slow  # 40 appends through a stream with maintenance rounds (~15 s)
def test_a_trickle_through_the_stream_stays_within_the_maintenance_bounds(conn, dsn, settings, monkeypatch):
    # 40 appends: past the newest 16 snapshots and the sync's own compaction point (16 small files) by more than the
    # bounds below allow, so both bounds need the rounds; 80 with LAKEHOUSE_SUITE_LONG=1 (bench/bench_suite_long.py)
    appends = 80 if os.environ.get("LAKEHOUSE_SUITE_LONG") == "1" else 40
    settings = _maintained_settings(monkeypatch)
    catalog = load_catalog(settings, dsn)
    d = _dataset(conn, datasets.create_workspace(conn, "w"), "trickle")
    most = {"snapshots": 0, "files": 0}

    def sample():
        snaps, files = _live(catalog, settings, d)
        most["snapshots"], most["files"] = max(most["snapshots"], len(snaps)), max(most["files"], files)

    with Stream(settings, dsn) as s:
        wait_caught_up(conn, [d])
        _trickle(conn, d, appends, 100, each=sample)
        time.sleep(2.5)  # a last round after the trickle: what is past the newest 16 and the pins goes
        commits = [r for r in s.synced() if r.mode != "noop"]
    assert len(commits) >= appends + 1  # one commit per append (and the first sync)
    # without maintenance: 41 snapshots (the commit-time expiry keeps an hour's) and up to 17 files (the sync's own
    # compaction waits for 16 small ones); with it, the newest 16 + what a round or two adds at this pace
    assert most["snapshots"] <= 32, most
    assert most["files"] <= 12, most
    rounds = _rounds(s)
    assert sum(r.compacted_files for r in rounds) > 0 and sum(r.expired_snapshots for r in rounds) > 0
    assert not [r for r in rounds if r.error], [r.error for r in rounds if r.error]
    snaps, files = _live(catalog, settings, d)
    assert len(snaps) <= 18 and files <= 4, (len(snaps), files)
    assert_parity(settings, dsn, [d])
    assert_nothing_twice(conn, [d])


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_snapshot_a_reader_was_handed_survives_the_streams_expiry(conn, dsn, settings, monkeypatch):
    pin = 60  # the window the second trickle must fit in (a few seconds): a loaded machine cannot overrun it
    settings = _maintained_settings(monkeypatch, LAKEHOUSE_MAINTENANCE_PIN_SECONDS=str(pin))
    catalog = load_catalog(settings, dsn)
    d = _dataset(conn, datasets.create_workspace(conn, "w"), "pinned")
    with Stream(settings, dsn) as s:
        wait_caught_up(conn, [d])
        _trickle(conn, d, 5, 100)
        # the pin window's clock is the sync log's finished_at against now() (tracking/sync_log.py HANDED_OUT):
        # those syncs are moved pin + 1 s back instead of the test sleeping that long
        conn.execute(
            "update iceberg_sync_log set started_at = started_at - make_interval(secs => %s),"
            " finished_at = finished_at - make_interval(secs => %s) where dataset_id = %s",
            (pin + 1, pin + 1, d),
        )  # those five are no reader's any more; the latest one is
        older, _ = _live(catalog, settings, d)
        # what the read router hands a reader now (routing/read_router.py): the latest succeeded sync's snapshot
        handed = conn.execute("select snapshot_id from lakehouse_latest_succeeded_sync(%s)", (d,)).fetchone()[0]
        table = catalog.load_table(table_identifier(settings, d))
        expected = table.scan(snapshot_id=handed).to_arrow().sort_by("__row_index")
        t0 = time.monotonic()
        _trickle(conn, d, 20, 200)  # 20 newer commits (and the rounds' own): the handed one is far past the newest 16
        rounds = len(_rounds(s))
        _wait_for(lambda: len(_rounds(s)) >= rounds + 2, "a round after the last commit")
        # still within the pin window of the handed snapshot (a precondition, not the property: 60 s for ~5 s of work)
        assert time.monotonic() - t0 < pin, "too slow to test the pin window"
        live, _ = _live(catalog, settings, d)
    assert sum(r.expired_snapshots for r in _rounds(s)) > 0
    assert older - {handed} and not (older - {handed}) & live  # the others of that time were expired
    assert handed in live  # the reader's snapshot was kept through every expiry
    again = catalog.load_table(table_identifier(settings, d)).scan(snapshot_id=handed).to_arrow()
    assert again.sort_by("__row_index").equals(expected)  # and the reader reads what it was handed
    assert expected.num_rows == 10
    assert_parity(settings, dsn, [d])


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_maintenance_skips_a_dataset_whose_lock_another_sync_holds_and_tries_again(conn, dsn, settings, monkeypatch):
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.core.guards import dataset_lock

    settings = _maintained_settings(monkeypatch)
    catalog = load_catalog(settings, dsn)
    d = _dataset(conn, datasets.create_workspace(conn, "w"), "locked")
    with Stream(settings, dsn) as s:
        wait_caught_up(conn, [d])
        _trickle(conn, d, 6, 100)
        with connect(dsn) as other, dataset_lock(other, d):  # as another process' sync of the dataset holds it (G3)
            time.sleep(0.5)  # a round already running ends
            held_from = len(_rounds(s))
            location = catalog.load_table(table_identifier(settings, d)).metadata_location
            time.sleep(4)
            during = _rounds(s)[held_from:]
            assert catalog.load_table(table_identifier(settings, d)).metadata_location == location  # nothing committed
        released = len(_rounds(s))
        deadline = time.time() + 20
        while not [r for r in _rounds(s)[released:] if not r.busy] and time.time() < deadline:
            time.sleep(0.1)
        after = _rounds(s)[released:]
    assert during and all(r.busy for r in during), during  # skipped while held, tried again about every second
    assert len(during) >= 2
    assert [r for r in after if not r.busy and r.error is None]  # and maintained once the lock was free
    assert_parity(settings, dsn, [d])


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_failed_maintenance_round_never_stops_the_stream(conn, dsn, settings, monkeypatch, caplog):
    settings = _maintained_settings(monkeypatch)
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "stream-maintenance:raise")
    d = _dataset(conn, datasets.create_workspace(conn, "w"), "failing")
    caplog.set_level("WARNING", logger="lakehouse_dagster.mirror.stream_maintenance")
    with Stream(settings, dsn) as s:
        wait_caught_up(conn, [d])
        _trickle(conn, d, 12, 100)
        deadline = time.time() + 20
        while len([r for r in _rounds(s) if r.error]) < 2 and time.time() < deadline:
            time.sleep(0.1)
        failed = [r for r in _rounds(s) if r.error]
        assert len(failed) >= 2 and s.thread.is_alive() and s.error is None  # failed, tried again, still streaming
        _trickle(conn, d, 3, 200)  # the stream goes on mirroring
        monkeypatch.delenv("LAKEHOUSE_FAILPOINT")
        deadline = time.time() + 20
        while not any(r.compacted_files for r in _rounds(s)) and time.time() < deadline:
            time.sleep(0.1)
    assert "FailpointError: failpoint stream-maintenance fired" in failed[0].error
    lines = [r.getMessage() for r in caplog.records if "stream maintenance" in r.getMessage()]
    assert len(lines) >= 2 and all("\n" not in line for line in lines)  # one line each, no traceback
    assert any(r.compacted_files for r in _rounds(s))  # tried again later: compacted once the fault was gone
    assert_parity(settings, dsn, [d])


# ---------------------------------------------------------------------------------------------------
# Dagster: the mirror_stream job and the poller's supervision.

import dagster as dg  # noqa: E402

from lakehouse_dagster.dagster.defs.mirror.sensors import mirror_poller  # noqa: E402
from lakehouse_dagster.dagster.defs.mirror.stream_job import SHARD_TAG, mirror_stream  # noqa: E402
from lakehouse_dagster.dagster.defs.resources import LakehouseResource  # noqa: E402
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE  # noqa: E402


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _tick(instance, dsn, cursor=None):
    ctx = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}
    )
    return mirror_poller(ctx)


def _batch_asked(res) -> list[str]:
    out = []
    for r in res.run_requests:
        if r.job_name == "mirror_batch_job":
            out += r.run_config["ops"]["mirror_datasets"]["config"]["datasets"]
        elif r.job_name == "mirror_job":
            out.append(r.partition_key)
    return out


def _stream_asked(res) -> list:
    return [r for r in res.run_requests if r.job_name == "mirror_stream"]


def _stream_run(instance, shard=0, count=1, status=dg.DagsterRunStatus.STARTED):
    return instance.create_run_for_job(job_def=mirror_stream, tags={SHARD_TAG: f"{shard}/{count}"}, status=status)


class _LinkedStop(threading.Event):
    """The test's stop: setting it sets every loop's stop it was linked to (the op hands the loop a stop of its own)."""

    def __init__(self):
        super().__init__()
        self._linked: list[threading.Event] = []

    def link(self, other: threading.Event) -> None:
        self._linked.append(other)
        if self.is_set():
            other.set()

    def set(self) -> None:
        super().set()
        for other in self._linked:
            other.set()


class _StoppableRun:
    """The mirror_stream op's loop (stream_shard) given a stop of the test's: ``stop`` ends it as its deadline would
    (the syncs in flight land, the run checks and logs what is left, as at its deadline), so an in-process run ends
    once the test has seen what it waits for instead of waiting out a fixed lifetime. ``events``: what the loop
    handed the op, in order (the op logs each before it asks for the next)."""

    def __init__(self, monkeypatch):
        self.stop = _LinkedStop()
        self.events: list = []

        def shard(*args, stop: threading.Event | None = None, **kw):
            stop = stop or threading.Event()  # the op's own (a signal to the run sets it); the test's sets it too
            self.stop.link(stop)
            inner = stream_shard(*args, stop=stop, **kw)
            try:
                for item in inner:
                    self.events.append(item)
                    yield item
            finally:
                inner.close()  # the op's close() reaches the loop: it waits for its syncs in flight

        monkeypatch.setattr("lakehouse_dagster.dagster.defs.mirror.stream_job.stream_shard", shard)

    def execute(self, instance, dsn, until) -> dg.ExecuteInProcessResult:
        """Runs ``until`` (the test's writes and waits) beside the in-process run, then stops the run; 120 s of
        lifetime is only the backstop of a wait that never ends."""
        error: list[BaseException] = []

        def later():
            try:
                until()
            except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
                error.append(exc)
            finally:
                self.stop.set()

        t = threading.Thread(target=later, daemon=True)
        t.start()
        result = mirror_stream.execute_in_process(
            run_config={"ops": {"stream_shard_op": {"config": {"shard": 0, "shards": 1, "lifetime_seconds": 120}}}},
            resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
            instance=instance,
        )
        t.join()
        if error:
            raise error[0]
        return result


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_stream_run_logs_each_sync_as_a_materialization_of_the_partition_with_its_checks(
    conn, dsn, settings, instance, monkeypatch
):
    ws = datasets.create_workspace(conn, "w")
    a, b = _dataset(conn, ws, "a"), _dataset(conn, ws, "b")

    def later():
        from lakehouse_dagster.core.db import connect

        with connect(dsn) as c:
            wait_caught_up(c, [a, b])  # the first sweep mirrored both
            datasets.insert_rows(c, a, [{"n": 42, "s": "streamed"}])
            wait_caught_up(c, [a])  # and the append landed: the run may stop

    result = _StoppableRun(monkeypatch).execute(instance, dsn, later)
    assert result.success
    # from the run's event log (what the UI reads): the stream logs its events at once, it does not yield them
    logged = instance.all_logs(result.run_id)
    mats = [
        e.dagster_event.step_materialization_data.materialization
        for e in logged
        if e.dagster_event is not None and e.dagster_event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION
    ]
    mats = [m for m in mats if m.asset_key == ICEBERG_TABLE]
    by_partition: dict = {}
    for m in mats:
        by_partition.setdefault(m.partition, []).append(m)
    assert set(by_partition) == {str(a), str(b)}
    assert len(by_partition[str(a)]) == 2  # the first sweep, then the append
    last = by_partition[str(a)][-1].metadata
    assert last["mode"].value == "incremental" and last["total_rows"].value == 6 and last["path"].value == "mirror"
    for key in ("snapshot_id", "source_version", "dataset_name", "dagster/row_count", "rows_per_s"):
        assert key in last, key
    snap = conn.execute(
        "select snapshot_id from iceberg_sync_log where dataset_id = %s and status = 'succeeded'"
        " order by finished_at desc limit 1",
        (a,),
    ).fetchone()[0]
    assert last["snapshot_id"].value == str(snap)
    # on the partition in the instance's event log (what the UI's partition page reads), from this run
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=ICEBERG_TABLE, asset_partitions=[str(a)]), limit=10
    ).records
    assert len(records) == 2 and {r.run_id for r in records} == {result.run_id}
    assert str(a) in instance.get_dynamic_partitions("datasets")  # the stream added the partitions it met
    # the checks of each mirrored partition, evaluated and recorded as a batch run records them
    evaluations = [
        e.dagster_event.asset_check_evaluation_data
        for e in logged
        if e.dagster_event is not None and e.dagster_event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
    ]
    checks = {(e.partition, e.check_name): e.passed for e in evaluations}
    for d in (a, b):
        for name in ("parity", "snapshot_freshness", "identity_ready"):
            assert checks[(str(d), name)] is True, (d, name)
    assert conn.execute("select count(*) from lakehouse_read_parity where dataset_id = %s", (a,)).fetchone()[0] >= 1


@pytest.mark.slow  # a stream run through 24 appends and the maintenance rounds after them
def test_a_stream_run_logs_what_its_maintenance_did_in_one_line_per_round(conn, dsn, settings, instance, monkeypatch):
    _maintained_settings(monkeypatch)
    d = _dataset(conn, datasets.create_workspace(conn, "w"), "trickle")
    run = _StoppableRun(monkeypatch)

    def later():
        from lakehouse_dagster.core.db import connect

        with connect(dsn) as c:
            _trickle(c, d, 24, 100)  # each append waits for its commit (the first for the run to start)
        # the run stops once a round compacted and one expired (the lines below are the op's account of them)
        _wait_for(
            lambda: any(r.compacted_files for r in _rounds(run)) and any(r.expired_snapshots for r in _rounds(run)),
            "a round that compacted and one that expired",
        )

    result = run.execute(instance, dsn, later)
    assert result.success
    lines = [e.user_message for e in instance.all_logs(result.run_id) if "maintenance of" in (e.user_message or "")]
    assert any("small data files compacted" in line for line in lines), lines
    assert any("snapshots expired" in line for line in lines), lines
    for line in lines:  # one line per round that did something, naming the dataset; nothing for a round that did not
        assert "\n" not in line and line.startswith(f"trickle: maintenance of {d}: "), line
        assert "compacted" in line or "expired" in line, line
    assert_parity(settings, dsn, [d])


def test_streaming_is_on_by_default_and_one_setting_turns_it_off(monkeypatch):
    from lakehouse_dagster.core.settings import Settings

    monkeypatch.delenv("LAKEHOUSE_MIRROR_STREAM", raising=False)  # the suite's conftest sets it off
    assert Settings.from_env().stream.enabled is True
    for off in ("false", "0", "off"):
        monkeypatch.setenv("LAKEHOUSE_MIRROR_STREAM", off)
        assert Settings.from_env().stream.enabled is False, off


def test_streaming_off_the_poller_requests_batch_runs_and_no_stream(conn, dsn, settings, instance, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_MIRROR_STREAM", "false")
    ws = datasets.create_workspace(conn, "w")
    ids = [_dataset(conn, ws, f"d{i}") for i in range(3)]
    res = _tick(instance, dsn)
    assert sorted(_batch_asked(res)) == sorted(str(d) for d in ids) and _stream_asked(res) == []


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_streaming_on_the_poller_keeps_a_stream_per_shard_and_batches_what_no_live_stream_covers(
    conn, dsn, settings, instance, monkeypatch
):
    monkeypatch.setenv("LAKEHOUSE_MIRROR_STREAM", "true")
    monkeypatch.setenv("LAKEHOUSE_MIRROR_SHARDS", "2")
    ws = datasets.create_workspace(conn, "w")
    ids = [_dataset(conn, ws, f"d{i}") for i in range(8)]
    # no stream has ever run: one run per shard, and the batch runs cover every dataset meanwhile
    first = _tick(instance, dsn)
    keys = sorted(r.run_key for r in _stream_asked(first))
    assert len(keys) == 2 and keys[0].startswith("stream-0of2-") and keys[1].startswith("stream-1of2-")
    assert {r.tags[SHARD_TAG] for r in _stream_asked(first)} == {"0/2", "1/2"}
    assert sorted(_batch_asked(first)) == sorted(str(d) for d in ids)
    # both runs created (not started yet): nothing more is requested
    runs = {shard: _stream_run(instance, shard, 2, dg.DagsterRunStatus.NOT_STARTED) for shard in (0, 1)}
    assert _stream_asked(_tick(instance, dsn, first.cursor)) == []
    # shard 0's stream is live (its loop holds the shard and beats): its datasets leave the batch path
    with Stream(settings, dsn, shard=0, count=2, run_id=runs[0].run_id) as s:
        assert s.held.wait(30)
        for d in ids:
            datasets.insert_rows(conn, d, [{"n": 9, "s": "x"}])
        res = _tick(instance, dsn, first.cursor)
        assert _stream_asked(res) == []
        assert sorted(_batch_asked(res)) == sorted(str(d) for d in ids if shard_of(d, 2) == 1)
        wait_caught_up(conn, [d for d in ids if shard_of(d, 2) == 0])


def test_the_poller_replaces_a_stream_whose_heartbeat_is_stale_and_starts_a_successor_before_the_deadline(
    conn, dsn, settings, instance, monkeypatch
):
    monkeypatch.setenv("LAKEHOUSE_MIRROR_STREAM", "true")
    ws = datasets.create_workspace(conn, "w")
    d = _dataset(conn, ws, "d")
    run = _stream_run(instance)
    # a holder SIGKILLed 20 s ago: its row says it holds the shard, its heartbeat stopped
    conn.execute(
        """insert into lakehouse_mirror_streams (shard_count, shard, run_id, started_at, heartbeat_at, deadline_at)
           values (1, 0, %s, now() - interval '60 seconds', now() - interval '20 seconds', now() + interval '800 seconds')""",
        (run.run_id,),
    )
    res = _tick(instance, dsn)
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
    (again,) = _stream_asked(res)
    assert _batch_asked(res) == [str(d)]  # covered by no live stream while the replacement starts
    # the replacement holds the shard and its deadline is near: its successor is requested, once, with a new key
    successor = _stream_run(instance)
    conn.execute(
        "update lakehouse_mirror_streams set run_id = %s, heartbeat_at = now(), deadline_at = now() + interval '5 seconds'",
        (successor.run_id,),
    )
    res2 = _tick(instance, dsn, res.cursor)
    (nxt,) = _stream_asked(res2)
    assert nxt.run_key != again.run_key and _batch_asked(res2) == []
    _stream_run(instance)  # the successor is queued: nothing more
    assert _stream_asked(_tick(instance, dsn, res2.cursor)) == []


def _status_json() -> dict:
    import contextlib
    import io
    import json

    from lakehouse_dagster.cli.main import main as cli_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["status", "--json"]) == 0
    return json.loads(out.getvalue())["mirror_stream"]


def test_lakehouse_status_shows_each_shard(conn, dsn, settings, monkeypatch):
    assert _status_json() == {"on": False, "shard_count": 1, "down_after_s": 30, "shards": [{"shard": 0, **_never()}]}
    monkeypatch.setenv("LAKEHOUSE_MIRROR_STREAM", "true")
    ws = datasets.create_workspace(conn, "w")
    d = _dataset(conn, ws, "d")
    with Stream(settings, dsn) as s:
        wait_caught_up(conn, [d])
        time.sleep(1.5)  # a heartbeat after the sync
        (live,) = _status_json()["shards"]
        assert live["alive"] and live["run_id"] == s.run_id and live["syncs"] == 1 and live["down_s"] is None
        assert live["last_commit_age_s"] is not None and live["last_commit_age_s"] < 30
    (ended,) = _status_json()["shards"]
    assert not ended["alive"] and ended["ended"] and ended["run_id"] == s.run_id and ended["down_s"] < 30


def _never() -> dict:
    keys = ("run_id", "heartbeat_age_s", "lag_s", "backlog", "last_commit_age_s")
    return {"alive": False, "ended": False, "down_s": None, **dict.fromkeys(keys), "syncs": 0, "failures": 0}
