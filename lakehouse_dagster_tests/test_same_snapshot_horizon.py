"""Issue 32, defect 4: the recorder and the mirror poller take their horizon (the snapshot's xmin) in the snapshot
they read in. Before, an empty read took it from a second statement, a newer snapshot: a transaction that committed
between the two fell below the horizon unread and was skipped for good. Driven deterministically: a transaction held
open on a second connection commits exactly between the read and whatever statement follows it."""

from __future__ import annotations

import psycopg

from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.mirror.poller import Cursor as PollerCursor
from lakehouse_dagster.mirror.poller import pending_syncs
from lakehouse_dagster.status.recording import FLAGS, Position, read_stream
from lakehouse_dagster.tracking import datasets
from lakehouse_dagster_tests.between_statements import after_statement

SCHEMA = [{"name": "n", "type": "int64"}]


def test_a_flag_change_committing_right_after_an_empty_read_is_still_recorded(conn, dsn):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    set_override(conn, "read", "graph.kuzu", "shadow", dataset=d, note="before", actor="pytest")
    _, pos = read_stream(conn, FLAGS, Position(), 100)
    with psycopg.connect(dsn) as late:  # not autocommit: its transaction stays open until it commits
        late.execute("select 1")
        set_override(late, "read", "export.stream", "shadow", dataset=d, note="late", actor="pytest")
        with after_statement(conn, "lakehouse_flag_audit", late.commit) as hook:
            changes, pos = read_stream(conn, FLAGS, pos, 100)  # the late row is not committed: an empty read
        assert changes == []
        if not hook["ran"]:
            late.commit()
    changes, pos = read_stream(conn, FLAGS, pos, 100)
    assert [c.row["note"] for c in changes] == ["late"]
    assert read_stream(conn, FLAGS, pos, 100)[0] == []  # once


def test_a_dataset_written_right_after_an_empty_poll_is_still_mirrored(conn, dsn):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    datasets.insert_rows(conn, d, [{"n": 1}])
    _, cursor, _ = pending_syncs(conn, PollerCursor(), limit=100)
    with psycopg.connect(dsn) as late:
        datasets.insert_rows(late, d, [{"n": 2}])  # stamps the dataset's rows_xid; commits only when told
        with after_statement(conn, "from datasets d", late.commit) as hook:
            pending, cursor, _ = pending_syncs(conn, cursor, limit=100)
        assert pending == []
        if not hook["ran"]:
            late.commit()
    pending, cursor, _ = pending_syncs(conn, cursor, limit=100)
    assert [p.dataset_id for p in pending] == [d]
