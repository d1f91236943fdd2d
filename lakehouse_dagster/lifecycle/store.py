"""``lakehouse_lifecycle`` and its append-only history (migration 036): every statement on them is here."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import psycopg

from lakehouse_dagster.lifecycle.states import Facts


def stored(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, tuple[Facts, int]]:
    """(facts, version) of each dataset that has a row."""
    ids = list(dataset_ids)
    if not ids:
        return {}
    rows = conn.execute(
        "select dataset_id, state, reverse, native_writers, version from lakehouse_lifecycle"
        " where dataset_id = any(%s::uuid[])",
        (ids,),
    ).fetchall()
    return {r[0]: (Facts(r[1], r[2], tuple(r[3] or ())), int(r[4])) for r in rows}


def stored_all(conn: psycopg.Connection) -> dict[uuid.UUID, tuple[Facts, int]]:
    rows = conn.execute(
        "select dataset_id, state, reverse, native_writers, version from lakehouse_lifecycle"
    ).fetchall()
    return {r[0]: (Facts(r[1], r[2], tuple(r[3] or ())), int(r[4])) for r in rows}


def record(
    conn: psycopg.Connection,
    dataset_id: uuid.UUID,
    before: Facts | None,
    after: Facts,
    *,
    verb: str,
    actor: str,
) -> int:
    """Store ``after`` (a new row, or the next version) and its history row; returns the version."""
    row = conn.execute(
        "insert into lakehouse_lifecycle (dataset_id, state, reverse, native_writers, verb, actor)"
        " values (%s, %s, %s, %s, %s, %s)"
        " on conflict (dataset_id) do update set state = excluded.state, reverse = excluded.reverse,"
        " native_writers = excluded.native_writers, version = lakehouse_lifecycle.version + 1, since = now(),"
        " verb = excluded.verb, actor = excluded.actor returning version",
        (dataset_id, after.state, after.reverse, list(after.native_writers), verb, actor),
    ).fetchone()
    assert row is not None
    conn.execute(
        "insert into lakehouse_lifecycle_history (dataset_id, version, before_state, before_reverse, after_state,"
        " after_reverse, verb, actor) values (%s, %s, %s, %s, %s, %s, %s, %s)",
        (
            dataset_id,
            row[0],
            before.state if before else None,
            before.reverse if before else None,
            after.state,
            after.reverse,
            verb,
            actor,
        ),
    )
    return int(row[0])


def set_writers(conn: psycopg.Connection, dataset_id: uuid.UUID, writers: tuple[str, ...]) -> None:
    """Which writers are native changed, the state did not (native by sync.full, then by sync.append too)."""
    conn.execute(
        "update lakehouse_lifecycle set native_writers = %s where dataset_id = %s", (list(writers), dataset_id)
    )


def history(conn: psycopg.Connection, dataset_id: uuid.UUID, limit: int = 20) -> list[dict]:
    rows = conn.execute(
        "select at, version, before_state, before_reverse, after_state, after_reverse, verb, actor"
        " from lakehouse_lifecycle_history where dataset_id = %s order by id desc limit %s",
        (dataset_id, limit),
    ).fetchall()
    keys = ("at", "version", "before_state", "before_reverse", "after_state", "after_reverse", "verb", "actor")
    return [dict(zip(keys, r)) for r in rows]


def state_counts(conn: psycopg.Connection) -> dict[str, int]:
    """Datasets per stored state (/metrics reads the stored state, never re-derives it)."""
    return dict(conn.execute("select state, count(*) from lakehouse_lifecycle group by state").fetchall())
