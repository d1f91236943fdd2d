"""``lakehouse_lifecycle`` and its append-only history (migration 036): every statement on them is here (their owner:
lakehouse_dagster_tests/test_table_owners.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

import psycopg
from psycopg import sql

from lakehouse_dagster.lifecycle.states import Facts
from lakehouse_dagster.tracking import sync_log


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


def stored_and_synced(
    conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, tuple[Facts, bool]]:
    """(facts, whether a ``pg`` row's dataset has a succeeded sync) of each dataset that has a row, in one
    statement: a ``pg`` row whose dataset was never synced is all there is to know (transition.py ``current``)."""
    ids = list(dataset_ids)
    if not ids:
        return {}
    rows = conn.execute(
        "select l.dataset_id, l.state, l.reverse, l.native_writers, l.state = 'pg' and "
        + sync_log.EVER_SYNCED_OF_ROW
        + " from lakehouse_lifecycle l where l.dataset_id = any(%s::uuid[])",
        (ids,),
    ).fetchall()
    return {r[0]: (Facts(r[1], r[2], tuple(r[3] or ())), bool(r[4])) for r in rows}


def state_statement(dataset_id: uuid.UUID) -> sql.Composed:
    """The stored state of one dataset as a statement with its id as a literal (any driver: a write's first
    statements, lifecycle/lock.py)."""
    return sql.SQL("select state, reverse, native_writers from lakehouse_lifecycle where dataset_id = {}::uuid").format(
        sql.Literal(str(dataset_id))
    )


def stored_all(conn: psycopg.Connection) -> dict[uuid.UUID, tuple[Facts, int]]:
    rows = conn.execute(
        "select dataset_id, state, reverse, native_writers, version from lakehouse_lifecycle"
    ).fetchall()
    return {r[0]: (Facts(r[1], r[2], tuple(r[3] or ())), int(r[4])) for r in rows}


def record_many(
    conn: psycopg.Connection, moves: Sequence[tuple[uuid.UUID, Facts | None, Facts]], *, verb: str, actor: str
) -> None:
    """``record`` for many datasets in two statements (a global flip moves thousands)."""
    if not moves:
        return
    ids = [d for d, _b, _a in moves]
    rows = conn.execute(
        "insert into lakehouse_lifecycle (dataset_id, state, reverse, native_writers, verb, actor)"
        " select m.d, m.s, m.r, coalesce(string_to_array(nullif(m.w, ''), ','), '{}'), %s, %s"
        "   from unnest(%s::uuid[], %s::text[], %s::boolean[], %s::text[]) as m(d, s, r, w)"
        " on conflict (dataset_id) do update set state = excluded.state, reverse = excluded.reverse,"
        " native_writers = excluded.native_writers, version = lakehouse_lifecycle.version + 1, since = now(),"
        " verb = excluded.verb, actor = excluded.actor returning dataset_id, version",
        (
            verb,
            actor,
            ids,
            [a.state for _d, _b, a in moves],
            [a.reverse for _d, _b, a in moves],
            [",".join(a.native_writers) for _d, _b, a in moves],
        ),
    ).fetchall()
    version: dict[uuid.UUID, int] = dict(rows)
    conn.execute(
        "insert into lakehouse_lifecycle_history (dataset_id, version, before_state, before_reverse, after_state,"
        " after_reverse, verb, actor)"
        " select m.d, m.v, m.bs, m.br, m.s, m.r, %s, %s"
        "   from unnest(%s::uuid[], %s::bigint[], %s::text[], %s::boolean[], %s::text[], %s::boolean[])"
        "     as m(d, v, bs, br, s, r)",
        (
            verb,
            actor,
            ids,
            [version[d] for d in ids],
            [b.state if b else None for _d, b, _a in moves],
            [b.reverse if b else None for _d, b, _a in moves],
            [a.state for _d, _b, a in moves],
            [a.reverse for _d, _b, a in moves],
        ),
    )


def set_writers(conn: psycopg.Connection, changed: list[tuple[uuid.UUID, tuple[str, ...]]]) -> None:
    """Which writers are native changed, the state did not (native by sync.full, then by sync.append too)."""
    if changed:
        conn.execute(
            "update lakehouse_lifecycle l set native_writers = coalesce(string_to_array(nullif(m.w, ''), ','), '{}')"
            "  from unnest(%s::uuid[], %s::text[]) as m(d, w) where l.dataset_id = m.d",
            ([d for d, _w in changed], [",".join(w) for _d, w in changed]),
        )


def observe_many(conn: psycopg.Connection, found: dict[uuid.UUID, Facts], *, actor: str) -> None:
    """First rows of datasets seen for the first time (a concurrent first sight keeps its own)."""
    if found:
        conn.execute(
            "insert into lakehouse_lifecycle (dataset_id, state, reverse, native_writers, verb, actor)"
            " select m.d, m.s, m.r, coalesce(string_to_array(nullif(m.w, ''), ','), '{}'), 'observe', %s"
            "   from unnest(%s::uuid[], %s::text[], %s::boolean[], %s::text[]) as m(d, s, r, w)"
            " on conflict (dataset_id) do nothing",
            (
                actor,
                list(found),
                [f.state for f in found.values()],
                [f.reverse for f in found.values()],
                [",".join(f.native_writers) for f in found.values()],
            ),
        )


def history(conn: psycopg.Connection, dataset_id: uuid.UUID, limit: int = 20) -> list[dict]:
    rows = conn.execute(
        "select at, version, before_state, before_reverse, after_state, after_reverse, verb, actor"
        " from lakehouse_lifecycle_history where dataset_id = %s order by id desc limit %s",
        (dataset_id, limit),
    ).fetchall()
    keys = ("at", "version", "before_state", "before_reverse", "after_state", "after_reverse", "verb", "actor")
    return [dict(zip(keys, r)) for r in rows]


def native_since_mirrored_without_native_write(conn: psycopg.Connection, dataset_id: uuid.UUID) -> bool:
    """Whether the dataset's last move into ``native`` came from ``mirrored`` or ``read-flipped`` and no native write
    has succeeded since (the sync log): runbooks/first_sync.py's "the next native write is its first". One
    statement, so the move and the writes since are read at one snapshot."""
    row = conn.execute(
        "select b.before_state in ('mirrored', 'read-flipped') and not "
        + sync_log.NATIVE_WRITE_SINCE_MOVE
        + """
             from (select h.at, h.before_state from lakehouse_lifecycle_history h
                    where h.dataset_id = %(d)s and h.after_state = 'native'
                      and h.before_state in ('pg', 'mirrored', 'read-flipped')
                    order by h.id desc limit 1) b""",
        {"d": dataset_id},
    ).fetchone()
    return bool(row and row[0])


def state_counts(conn: psycopg.Connection) -> dict[str, int]:
    """Datasets per stored state (/metrics reads the stored state, never re-derives it)."""
    return dict(conn.execute("select state, count(*) from lakehouse_lifecycle group by state").fetchall())
