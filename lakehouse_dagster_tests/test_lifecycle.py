"""One lifecycle per dataset (issue 42): the reproductions of what a rollout passes through and used to lose or
misreport, each seen failing before the lifecycle existed, and the table of transitions as the docs state it."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import FlipRefused
from lakehouse_dagster.flags.gates import set_flag
from lakehouse_dagster.flags.lifecycle_facts import lifecycle_of
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.lifecycle import TRANSITIONS, LifecycleRefused, WriteRefused, history
from lakehouse_dagster.lifecycle.states import markdown_table
from lakehouse_dagster.runbooks import complete as cp
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.sources.writers import run_writer
from lakehouse_dagster.tracking import ingest_state

from .test_complete import _completable, _native, _pg_rows

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _source_file(tmp_path: Path, n: int = 3) -> str:
    path = tmp_path / "src" / "rows.ndjson"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"a": 100 + i, "s": f"src {i}", "x": 0.5, "at": "2024-02-01T00:00:00+00:00", "doc": {"i": i}})
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_the_docs_state_the_table_of_transitions_the_code_enforces():
    doc = (DOCS / "lifecycle.md").read_text()
    assert markdown_table() in doc, "docs/lifecycle.md: paste lakehouse_dagster.lifecycle.states.markdown_table()"
    assert markdown_table().count("\n| `") == len(TRANSITIONS)


def test_a_pg_writer_beside_a_native_one_is_refused_and_loses_nothing(conn, dsn, settings, lh, tmp_path):
    """Item 1: sync.append native, sync.full still pg (the runbook flips one writer at a time). Before, the sync.full
    ingest wrote dataset_rows, the forward mirror refused the dataset and the reverse's next re-sync deleted the
    rows, while the ingest state said the source was read: the rows were in neither store."""
    d = _native(conn, dsn, settings, lh)
    set_source(conn, d, {"type": "files", "uri": _source_file(tmp_path), "format": "ndjson"})
    rows, state = _pg_rows(conn, d), ingest_state.pg_state(conn, d)
    catalog = load_catalog(settings, dsn)
    with pytest.raises(WriteRefused) as refused:
        run_writer(dsn, catalog, settings, FlagResolver(conn, 0), d, "sync.full")
    text = str(refused.value)
    assert f"refused: sync.full would write dataset {d} into Postgres, but the dataset is native (reverse on)" in text
    assert f"lakehouse write-flags set sync.full iceberg_native --dataset {d}" in text
    assert "nothing was written" in text
    assert _pg_rows(conn, d) == rows and ingest_state.pg_state(conn, d) == state
    # the CLI says it in one line, with the refusal's exit code
    code, _, err = lh("ingest", "--dataset", str(d), "--writer", "sync.full")
    assert code == 6 and "but the dataset is native" in err and len(err.strip().splitlines()) == 1, err
    assert _pg_rows(conn, d) == rows


def test_an_ingest_into_a_completed_dataset_is_refused(conn, dsn, settings, lh, tmp_path):
    d = _completable(conn, dsn, settings, lh)
    lh("complete", "--dataset", str(d), check=True)
    set_source(conn, d, {"type": "files", "uri": _source_file(tmp_path), "format": "ndjson"})
    with pytest.raises(WriteRefused, match="is complete .*Iceberg is its only store"):
        run_writer(dsn, load_catalog(settings, dsn), settings, FlagResolver(conn, 0), d, "sync.full")
    assert _pg_rows(conn, d) == []


def _waiting_on_an_advisory_lock(conn, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if conn.execute(
            "select exists(select 1 from pg_stat_activity where datname = current_database()"
            " and wait_event_type = 'Lock' and wait_event = 'advisory')"
        ).fetchone()[0]:
            return True
        time.sleep(0.05)
    return False


def test_a_writer_rollback_and_complete_never_interleave(conn, dsn, settings, lh):
    """Item 2: complete's checks held only G3 and the rollback's gate never took it, so a rollback committing while
    complete checked let complete delete every Postgres row with the writer back on pg."""
    d = _completable(conn, dsn, settings, lh)
    rows = _pg_rows(conn, d)
    catalog = load_catalog(settings, dsn)
    outcome: dict = {}

    def run_complete():
        try:
            outcome["result"] = cp.complete(dsn, catalog, settings, d, actor="op-2")
        except Exception as exc:  # noqa: BLE001 - the outcome is asserted below
            outcome["error"] = exc

    with connect(dsn) as rollback:
        with rollback.transaction():  # the rollback passed its gates and has not committed yet
            set_flag(rollback, "write", "sync.append", "pg", dataset=d, note="roll back", actor="op-1")
            racer = threading.Thread(target=run_complete)
            racer.start()
            waited = _waiting_on_an_advisory_lock(conn)
        racer.join(120)
    assert waited, "complete did not wait for the rollback in flight"
    assert isinstance(outcome.get("error"), FlipRefused), outcome
    assert "not written iceberg-native" in str(outcome["error"])
    assert _pg_rows(conn, d) == rows
    assert lifecycle_of(conn, [d])[d].state == "read-flipped"


def test_reverse_on_after_complete_is_refused_naming_the_state_and_the_way_back(conn, dsn, settings, lh):
    """Item 3: `lakehouse reverse on` after complete quietly copied every row back while the dataset stayed
    marked complete (status complete, a rollback refused, the page contradicting itself)."""
    d = _completable(conn, dsn, settings, lh)
    lh("complete", "--dataset", str(d), check=True)
    for args in (("on", "--dataset", str(d)), ("clear", "--dataset", str(d))):
        code, _, err = lh("reverse", *args)
        assert code == 6, err
        assert f"dataset orders ({d}) is complete (reverse off); this would leave it complete (reverse on)" in err
        assert f"the way on: restore it from Iceberg first (lakehouse backfill --dataset {d})" in err
    assert _pg_rows(conn, d) == []
    assert lifecycle_of(conn, [d])[d].describe() == "complete (reverse off)"
    # the way back the refusal names works, and the history tells the whole road
    lh("backfill", "--dataset", str(d), check=True)
    assert lifecycle_of(conn, [d])[d].describe() == "native (reverse on)"
    road = [(h["before_state"], h["after_state"], h["verb"]) for h in reversed(history(conn, d))]
    assert road[-4:] == [
        ("native", "completing", "complete"),
        ("completing", "complete", "complete"),
        ("complete", "restoring", "restore"),
        ("restoring", "native", "restore"),
    ]


def test_a_global_verb_that_would_strand_one_dataset_is_refused_whole(conn, dsn, settings, lh):
    """A global reverse clear over a completed dataset pinned off is no move; a global writer clear would take a
    completed dataset off iceberg_native: refused, nothing written, the dataset named."""
    d = _completable(conn, dsn, settings, lh)
    lh("complete", "--dataset", str(d), check=True)
    assert lh("reverse", "on")[0] == 0  # the dataset's own setting (off) still wins: no move
    code, _, err = lh("write-flags", "clear", "sync.append", "--dataset", str(d))
    assert code == 6 and "was completed on" in err  # the gate says it first
    with pytest.raises(LifecycleRefused, match=f"dataset orders \\({d}\\) is complete"):
        from lakehouse_dagster.flags.overrides import clear_override

        clear_override(conn, "write", "sync.append", dataset=d, actor="ungated")
    assert lifecycle_of(conn, [d])[d].state == "complete"
    assert uuid.UUID(str(d))


def test_the_first_native_write_is_checked_wherever_it_is_made(conn, dsn, settings, lh):
    """Item 8: the first native write made outside `write-flags flip` (a set, the source poller, `lakehouse ingest`,
    the service) got no first-native canary, and the reverse copied it into Postgres before anyone checked it. Now
    the canary is a property of the write: `lakehouse ingest` after a plain `write-flags set` runs it, and a source
    that moved on since Postgres last held it (the documented rule: a MISMATCH) rolls the writer back."""
    from .native_helpers import add_source_rows, row
    from .test_write_flip_first_sync import _fed

    d, src = _fed(conn, dsn, settings)
    from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary

    assert [
        v.verdict for v in run_canary(conn, dsn, load_catalog(settings, dsn), settings, dataset_ids=[str(d)]).results
    ] == ["ok"]
    lh("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(d), check=True)
    add_source_rows(conn, src, [row(6)])  # the source moved on since Postgres last held it
    code, out, err = lh("ingest", "--dataset", str(d), "--writer", "sync.full")
    assert code == 1, out + err
    assert f"first native write of {d}: canary MISMATCH" in out
    assert "auto-rollback: writer sync.full iceberg_native → pg" in out
    assert FlagResolver(conn, ttl_seconds=0).resolve("write", "sync.full", d).mode == "pg"
    verdicts = conn.execute(
        "select verdict from lakehouse_read_parity where dataset_id = %s and source = 'first-native-sync'", (d,)
    ).fetchall()
    assert verdicts == [("MISMATCH",)]
    # the next ingest is on pg again (Postgres is the truth): no canary, exit 0
    code, out, err = lh("ingest", "--dataset", str(d), "--writer", "sync.full")
    assert code == 0 and "via pg" in out and "first native write" not in out, out + err


def test_verbs_on_two_datasets_never_wait_for_each_other_and_one_dataset_s_do(conn, dsn):
    """The lifecycle lock is per dataset for a dataset's verb: another dataset's verb in flight does not hold it up,
    the same dataset's does (it waits, here until its lock timeout)."""
    import psycopg

    from lakehouse_dagster.flags.overrides import set_override
    from lakehouse_dagster.tracking import datasets

    ws = datasets.create_workspace(conn, "w")
    a, b = (datasets.create_dataset(conn, ws, n, [{"name": "x", "type": "int64"}]) for n in ("a", "b"))
    with connect(dsn) as other, other.transaction():
        set_override(other, "read", "export.stream", "shadow", dataset=a, actor="op-1")  # not committed yet
        conn.execute("set lock_timeout = '3s'")
        set_override(conn, "read", "export.stream", "shadow", dataset=b, actor="op-2")  # no wait
        with pytest.raises(psycopg.errors.LockNotAvailable):
            set_override(conn, "read", "export.stream", "iceberg", dataset=a, actor="op-2")
        conn.execute("set lock_timeout = 0")


def test_a_never_synced_pg_dataset_is_answered_as_stored_without_re_deriving(conn, dsn, settings):
    """Issue 45: every pg-path write of a dataset stored ``pg`` re-derived its state (six queries and a transaction),
    though without a verb only the mirror's first snapshot moves it on, and that needs a succeeded sync. The
    answers are those re-deriving gave (seen on main: every assertion but the last ``calls`` one held there), also
    with a writer flag set behind the lifecycle's back; once a sync succeeded, the state is re-derived and the
    mirror's move recorded."""
    from lakehouse_dagster.flags import overrides_store
    from lakehouse_dagster.flags.lifecycle_facts import derive
    from lakehouse_dagster.lifecycle.states import Facts
    from lakehouse_dagster.lifecycle.transition import current
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.tracking import datasets

    from .native_helpers import SCHEMA, row

    ws = datasets.create_workspace(conn, "ws-pg")
    d = datasets.create_dataset(conn, ws, "never-synced", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(3)])
    calls: list[list] = []

    def counted(c, ids):  # the real derive, its calls counted
        calls.append(list(ids))
        return derive(c, ids)

    pg = Facts("pg", None, ())
    assert current(conn, [d], counted, "pytest") == {d: pg}  # first sight: derived and recorded (observe)
    assert calls == [[d]] and history(conn, d) == []  # a first row, no move
    calls.clear()
    assert current(conn, [d], counted, "pytest") == {d: pg}
    # a writer flag behind the lifecycle's back: the facts say native, which is no move of the mirror's, so the
    # stored pg was the answer when re-derived too; the write paths resolve the flag themselves
    overrides_store.upsert(conn, "write", "sync.full", "dataset", d, "iceberg_native", None, "pytest")
    assert derive(conn, [d])[d].state == "native"
    assert current(conn, [d], counted, "pytest") == {d: pg}
    overrides_store.delete(conn, "write", "sync.full", "dataset", d)
    assert history(conn, d) == []  # nothing recorded meanwhile
    no_derive = list(calls)
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d)  # the first snapshot: re-derived, the move recorded
    assert current(conn, [d], counted, "pytest")[d] == Facts("mirrored", None, ())
    assert [(h["verb"], h["before_state"], h["after_state"]) for h in history(conn, d)] == [
        ("mirror", "pg", "mirrored")
    ]
    assert calls[len(no_derive) :] == [[d]]
    assert no_derive == [], f"re-derived a never-synced pg dataset {len(no_derive)} time(s)"


def test_the_service_s_checked_write_opens_its_connection_only_for_a_native_writer(conn, dsn, settings, lh):
    """Issue 45: the service opened a connection for every ingest, for ``checked_write``'s first-native check; it
    passes None now, and the first native write still gets its canary (on a connection ``checked_write`` opens)
    and its auto-rollback, the next pg-path ingest none."""
    from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary
    from lakehouse_dagster.runbooks.first_sync import checked_write

    from .native_helpers import add_source_rows, row
    from .test_write_flip_first_sync import _fed

    d, src = _fed(conn, dsn, settings)
    catalog = load_catalog(settings, dsn)
    assert [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results] == ["ok"]
    lh("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(d), check=True)
    add_source_rows(conn, src, [row(6)])  # a MISMATCH by design (docs/lifecycle.md)
    first = checked_write(None, dsn, catalog, settings, FlagResolver(conn, ttl_seconds=0), d, "sync.full")
    assert first.result.path == "native" and first.first_native is not None
    assert first.first_native.verdict == "MISMATCH" and first.first_native.rolled_back
    assert FlagResolver(conn, ttl_seconds=0).resolve("write", "sync.full", d).mode == "pg"
    again = checked_write(None, dsn, catalog, settings, FlagResolver(conn, ttl_seconds=0), d, "sync.full")
    assert again.result.path == "pg" and again.first_native is None
