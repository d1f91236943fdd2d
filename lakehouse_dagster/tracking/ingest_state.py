"""Where a dataset's ingest state (cursor, CDC position, files seen) lives: ONE truth across both write paths.

The state is a JSON object ``{"seq", "sync_id", "path", "writer", "source", "mark", "files"}``, stored twice:

* ``lakehouse_source_state`` (Postgres): a pg-path ingest writes it in the SAME transaction as its rows
  in ``dataset_rows``;
* the Iceberg table property ``lakehouse.source-state``: a native ingest writes it in the SAME commit as
  its data files (with ``seq`` and the sync id in the snapshot summary too).

So each copy is exactly as new as the data of the path that wrote it: a process killed between the data
and the state cannot exist on either path. ``seq`` grows by one per ingest (under the dataset lock, G3,
from the larger of the two copies), and on read **the copy with the higher seq wins**: it belongs to the
latest successful write, whichever path made it. A dataset that ingested on pg and is then flipped to
native continues from where the pg path stopped, and back. After a native commit the state is also
copied into the Postgres table (same seq) so cheap readers (a sensor) see it; if that copy is lost to a
crash, the Iceberg copy still wins by seq. A state recorded for a different source spec is ignored (a new
source starts from scratch).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
from psycopg import sql

STATE_PROPERTY = "lakehouse.source-state"
SEQ_SUMMARY = "lakehouse.source-seq"
MARK_SUMMARY = "lakehouse.source-mark"


def pg_state(conn: psycopg.Connection, dataset_id: uuid.UUID) -> dict | None:
    row = conn.execute("select state from lakehouse_source_state where dataset_id = %s", (dataset_id,)).fetchone()
    return row[0] if row else None


def table_state(table) -> dict | None:
    raw = table.properties.get(STATE_PROPERTY) if table is not None else None
    return json.loads(raw) if raw else None


def current_state(conn: psycopg.Connection, dataset_id: uuid.UUID, table, source: dict | None = None) -> dict | None:
    """The state of the latest successful ingest (higher seq of the two copies); None when there is none
    or it was recorded for another source than ``source``."""
    copies = [s for s in (pg_state(conn, dataset_id), table_state(table)) if s]
    if not copies:
        return None
    latest = max(copies, key=lambda s: int(s.get("seq", 0)))
    if source is not None and latest.get("source") != source:
        return None
    return latest


def next_seq(conn: psycopg.Connection, dataset_id: uuid.UUID, table) -> int:
    copies = [s for s in (pg_state(conn, dataset_id), table_state(table)) if s]
    return 1 + max((int(s.get("seq", 0)) for s in copies), default=0)


def save_statement(dataset_id: uuid.UUID, state: dict) -> sql.Composed:
    """Upsert of the Postgres copy (a lower seq never overwrites a higher one), as one statement so the pg
    path can run it inside its own data transaction."""
    return sql.SQL(
        """insert into lakehouse_source_state (dataset_id, seq, state, sync_id, path, writer, written_at)
           values ({}::uuid, {}, {}::jsonb, {}::uuid, {}, {}, now())
           on conflict (dataset_id) do update
              set seq = excluded.seq, state = excluded.state, sync_id = excluded.sync_id, path = excluded.path,
                  writer = excluded.writer, written_at = excluded.written_at
            where lakehouse_source_state.seq <= excluded.seq"""
    ).format(
        *(
            sql.Literal(v)
            for v in (
                str(dataset_id),
                int(state["seq"]),
                json.dumps(state),
                str(state["sync_id"]),
                state["path"],
                state["writer"],
            )
        )
    )


def save_pg_state(conn: psycopg.Connection, dataset_id: uuid.UUID, state: dict) -> None:
    conn.execute(save_statement(dataset_id, state))


def commit_entries(state: dict) -> tuple[dict[str, str], dict[str, str]]:
    """The table properties and snapshot summary entries a native commit carries."""
    props = {STATE_PROPERTY: json.dumps(state, separators=(",", ":"), sort_keys=True)}
    summary = {SEQ_SUMMARY: str(state["seq"])}
    if state.get("mark") is not None:
        summary[MARK_SUMMARY] = str(state["mark"])
    return props, summary


def public_cursor(state: dict | None) -> Any:
    """What an IngestResult / `sources show` reports as the cursor."""
    if not state:
        return None
    if state.get("files") is not None:
        return {"files": len(state["files"])}
    return state.get("mark")
