"""Reverse lag: how far the reverse mirror (mirror/reverse.py) is behind each native dataset with it on, from Postgres.

``mirror.reverse.reverse_states`` tells caught up from behind by loading each table (its current snapshot); the
overview reads thousands of datasets and keeps a bounded number of statements, so this asks what ``due_datasets``
asks, in one query: the succeeded commits the sync log records for the dataset since its position's apply
(``lakehouse_reverse_position``) with another snapshot. None: caught up. Otherwise the oldest of them is how long
Postgres has lacked a native commit (the lag), the newest the snapshot the reverse must reach. Without a position
(the reverse never applied a snapshot) every native commit since the dataset's last mirrored sync is pending.

Every statement on ``lakehouse_reverse_position`` is here (its owner: lakehouse_dagster_tests/test_table_owners.py),
so that the light readers (the overview, the service, the shadow reads) need not load the reverse mirror: the
reverse mirror writes the position through ``position_statement`` inside its apply's transaction.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg
from psycopg import sql

from lakehouse_dagster.flags.reverse_setting import reverse_settings
from lakehouse_dagster.tracking import sync_log
from lakehouse_dagster.tracking.datasets import fragments

_LAG = (
    """
select d.id, p.snapshot_id, p.applied_at, l.pending, l.since, l.latest, extract(epoch from now() - l.since)
  from unnest(%s::uuid[]) d(id)
  left join lakehouse_reverse_position p on p.dataset_id = d.id
  left join lateral """
    + sync_log.PENDING_SINCE_POSITION
    + """ l on true
"""
)


@dataclasses.dataclass(frozen=True)
class ReverseLag:
    dataset_id: uuid.UUID
    applied_snapshot: int | None  # the snapshot dataset_rows holds (None: the reverse never applied one)
    applied_at: dt.datetime | None
    pending: int  # native commits recorded since, not applied yet
    latest_snapshot: int | None  # the newest of them (None: caught up)
    lag_seconds: float | None  # since the oldest of them (None: caught up)
    name: str = ""  # the dataset's name, when the caller knows it
    since: dt.datetime | None = None  # when the oldest commit not applied yet was recorded (None: caught up)

    @property
    def caught_up(self) -> bool:
        return self.pending == 0

    def describe(self) -> str:
        held = (
            "never applied a snapshot" if self.applied_snapshot is None else f"holds snapshot {self.applied_snapshot}"
        )
        if self.caught_up:
            return f"reverse caught up ({held})"
        return (
            f"reverse behind by {self.pending} commit(s), {self.lag_seconds or 0:.0f} s (it {held}; "
            f"Iceberg is at {self.latest_snapshot}): lakehouse reverse sync --dataset {self.dataset_id}"
        )

    def as_dict(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "dataset_id": str(self.dataset_id),
            "applied_at": None if self.applied_at is None else self.applied_at.isoformat(),
            "since": None if self.since is None else self.since.isoformat(),
            "caught_up": self.caught_up,
        }


def reverse_lags(conn: psycopg.Connection, native: set[uuid.UUID]) -> tuple[dict[uuid.UUID, ReverseLag], int]:
    """({native dataset with the reverse on: its lag}, how many native datasets have it off): two queries."""
    if not native:
        return {}, 0
    setting = reverse_settings(conn, native)
    on = sorted(d for d in native if d in setting and setting[d].enabled)
    if not on:
        return {}, len(native)
    out = {}
    for ds_id, snap, applied_at, pending, since, latest, lag in conn.execute(_LAG, (on,)).fetchall():
        n = int(pending or 0)
        out[ds_id] = ReverseLag(
            ds_id,
            snap,
            applied_at,
            n,
            latest if n else None,
            round(float(lag), 1) if n and lag is not None else None,
            since=since if n else None,
        )
    return out, len(native) - len(on)


def position_rows(conn: psycopg.Connection, dataset_ids: list[uuid.UUID]) -> list[tuple]:
    """(dataset_id, snapshot_id, how, rows_copied, rows_removed, pg_rows, applied_at, rows_version) of each position."""
    return conn.execute(
        "select dataset_id, snapshot_id, how, rows_copied, rows_removed, pg_rows, applied_at, rows_version"
        " from lakehouse_reverse_position where dataset_id = any(%s::uuid[])",
        (dataset_ids,),
    ).fetchall()


def held_snapshot(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple | None:
    """(the snapshot dataset_rows holds,) by the position, or None without one (a shadow read's check)."""
    return conn.execute(
        "select snapshot_id from lakehouse_reverse_position where dataset_id = %s", (dataset_id,)
    ).fetchone()


def forget_position(conn: psycopg.Connection, dataset_id: uuid.UUID) -> None:
    """No position holds (a complete: the reverse is off and the rows are going)."""
    conn.execute("delete from lakehouse_reverse_position where dataset_id = %s", (dataset_id,))


def position_statement(
    ds: sql.Composable, snapshot_id: int, how: str, copied: int, removed: int, pg_rows: int
) -> sql.Composed:
    """The position an apply leaves, as one statement with its values as literals (``ds``: the dataset id, a literal),
    run in the apply's transaction with the rows it copied."""
    return sql.SQL(
        "insert into lakehouse_reverse_position (dataset_id, snapshot_id, how, rows_copied, rows_removed, pg_rows,"
        " rows_version) values ({ds}::uuid, {snap}, {how}, {c}, {r}, {n},"
        " {rows_version}) on conflict (dataset_id) do update set"
        " snapshot_id = excluded.snapshot_id, how = excluded.how, rows_copied = excluded.rows_copied,"
        " rows_removed = excluded.rows_removed, pg_rows = excluded.pg_rows, applied_at = now(),"
        " xid = pg_current_xact_id(), rows_version = excluded.rows_version"
    ).format(
        ds=ds,
        rows_version=fragments.rows_version_of(ds),
        snap=sql.Literal(snapshot_id),
        how=sql.Literal(how),
        c=sql.Literal(copied),
        r=sql.Literal(removed),
        n=sql.Literal(pg_rows),
    )


_DUE = (
    """
select d.id """
    + fragments.FROM_DATASETS
    + """
  left join lakehouse_reverse_position p on p.dataset_id = d.id
 where d.id = any(%s::uuid[]) and d.kind = 'tabular'
   and ((p.dataset_id is null
         and """
    + sync_log.EVER_SUCCEEDED
    + """)
        or """
    + sync_log.SUCCEEDED_SINCE_POSITION
    + """)
 order by d.id
"""
)


def due_dataset_ids(conn: psycopg.Connection, dataset_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """Those of ``dataset_ids`` (tabular) with no position but a succeeded commit, or a succeeded commit of another
    snapshot since their position's apply (mirror/reverse.py ``due_datasets``)."""
    return [r[0] for r in conn.execute(_DUE, (dataset_ids,)).fetchall()]
