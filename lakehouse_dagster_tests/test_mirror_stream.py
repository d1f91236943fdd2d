"""The mirror as a stream (mirror/stream.py, the mirror_stream job, the poller's supervision): real Postgres, real
Iceberg tables, real Dagster runs. Postgres equal to Iceberg is judged by the parity digest (a full cross-check)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from lakehouse_dagster.flags import set_override
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.mirror.batch import Failed
from lakehouse_dagster.mirror.stream import Idle, shard_of, stream_shard
from lakehouse_dagster.mirror.sync import SyncResult
from lakehouse_dagster.parity import canary
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]


class Stream:
    """One stream_shard loop in a thread, as a stream run runs it; ``events`` are what it yielded."""

    def __init__(self, settings, dsn, *, shard=0, count=1, seconds=60.0, run_id=None, wait_until=None):
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


def test_two_shards_split_the_datasets(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "w")
    ids = [_dataset(conn, ws, f"d{i}") for i in range(8)]
    assert {shard_of(d, 2) for d in ids} == {0, 1}  # uuid4s: with 8, both shards get some (1 in 128 they do not)
    with Stream(settings, dsn, shard=0, count=2) as s0, Stream(settings, dsn, shard=1, count=2) as s1:
        wait_caught_up(conn, ids)
        for d in ids:
            datasets.insert_rows(conn, d, [{"n": 50, "s": "more"}])
        wait_caught_up(conn, ids)
    for s, shard in ((s0, 0), (s1, 1)):
        assert s.synced() and {r.dataset_id for r in s.synced()} == {d for d in ids if shard_of(d, 2) == shard}
    assert_parity(settings, dsn, ids)
    assert_nothing_twice(conn, ids)


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

    first = Stream(settings, dsn, seconds=4.0)
    assert first.held.wait(30)
    w = threading.Thread(target=writer, daemon=True)
    w.start()
    time.sleep(1.0)
    second = Stream(settings, dsn, seconds=60.0)  # started before the first ends: waits on the shard's lock
    time.sleep(1.0)
    assert not second.held.is_set()  # the first still holds the shard
    first.thread.join(30)
    assert first.error is None and not first.thread.is_alive()
    assert second.held.wait(10)
    time.sleep(2.0)  # writes go on under the second
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
