"""Incidents: what restarts a soak (flags/widen.py) — a MISMATCH verdict, a failed sync, a read fallback.

MISMATCH verdicts are in lakehouse_read_parity and failed syncs in iceberg_sync_log already; a read
fallback was only a log line, so the read router records each one here too (``record_fallback``).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from datetime import datetime

import psycopg
from psycopg import sql

from lakehouse_dagster.parity.verdicts import MISMATCH_INCIDENTS
from lakehouse_dagster.tracking.sync_log import FAILED_SYNC_INCIDENTS

log = logging.getLogger("lakehouse_dagster.flags")

MISMATCH = "MISMATCH verdict"
FAILED_SYNC = "failed sync"
FALLBACK = "read fallback"
_DETAIL_CHARS = 160


@dataclasses.dataclass(frozen=True)
class Incident:
    dataset_id: uuid.UUID
    at: datetime
    what: str  # MISMATCH | FAILED_SYNC | FALLBACK
    reader: str | None  # the reader that fell back (FALLBACK only)
    detail: str
    dataset_name: str | None = None  # filled in by whoever names it (soak.soak)

    def describe(self) -> str:
        who = f" of {self.reader}" if self.reader else ""
        on = f" on {self.dataset_name} ({self.dataset_id})" if self.dataset_name else f" on dataset {self.dataset_id}"
        return f"{self.what}{who}{on} at {self.at:%Y-%m-%d %H:%M:%S} UTC ({self.detail})"


ERROR_CHARS = 1000  # what is kept of a fallback's error


def insert_fallback(conn: psycopg.Connection, reader: str, dataset_id: uuid.UUID, error: str) -> tuple[int, datetime]:
    """The one row of a read served by Postgres after an Iceberg error (what the soak, the rollout analysis, the
    recorder and the overview read); raises if it cannot be written. Returns its id and time."""
    row = conn.execute(
        "insert into lakehouse_read_fallbacks (reader, dataset_id, error) values (%s, %s, %s) returning id, at",
        (reader, dataset_id, error[:ERROR_CHARS]),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def record_fallback(conn: psycopg.Connection, reader: str, dataset_id: uuid.UUID, error: str) -> None:
    """The read router's record of its own fallback (``insert_fallback``); never fails the read it records."""
    try:
        with conn.transaction():  # a savepoint inside the caller's transaction: a failure here leaves it intact
            insert_fallback(conn, reader, dataset_id, error)
    except Exception as exc:  # the read was served; losing its record only makes the soak less strict
        log.warning("could not record the read fallback of %s ds=%s: %s", reader, dataset_id, type(exc).__name__)


_LATEST = sql.SQL("""
select distinct on (dataset_id, what, reader) dataset_id, at, what, reader, detail from ({mismatches}
  union all{failed_syncs}
  union all
  select dataset_id, at, %(fallback)s, reader, split_part(error, E'\\n', 1)
    from lakehouse_read_fallbacks
   where dataset_id = any(%(ids)s::uuid[]) and at >= %(since)s
) i
order by dataset_id, what, reader, at desc
""").format(mismatches=MISMATCH_INCIDENTS, failed_syncs=FAILED_SYNC_INCIDENTS)


def latest_incidents(
    conn: psycopg.Connection, dataset_ids: list[uuid.UUID], since: datetime
) -> dict[uuid.UUID, list[Incident]]:
    """{dataset: the latest incident of each kind (and each reader's latest fallback) at or after ``since``}."""
    out: dict[uuid.UUID, list[Incident]] = {}
    if not dataset_ids:
        return out
    rows = conn.execute(
        _LATEST,
        {"ids": list(dataset_ids), "since": since, "mismatch": MISMATCH, "failed": FAILED_SYNC, "fallback": FALLBACK},
    ).fetchall()
    for ds_id, at, what, reader, detail in rows:
        out.setdefault(ds_id, []).append(Incident(ds_id, at, what, reader, (detail or "")[:_DETAIL_CHARS]))
    return out


# Every statement on lakehouse_read_fallbacks is in this module (its owner: lakehouse_dagster_tests/test_table_owners.py).

# Each dataset's and reader's read fallbacks of the window (lakehouse_read_fallbacks_at_idx), the newest's error.
_IN_WINDOW = """
select dataset_id, reader, count(*), max(at), (array_agg(split_part(error, E'\n', 1) order by at desc, id desc))[1]
  from lakehouse_read_fallbacks
 where at >= now() - make_interval(secs => %s)
 group by dataset_id, reader
"""


def fallbacks_in_window(conn: psycopg.Connection, seconds: float) -> list[tuple]:
    """(dataset, reader, count, newest at, newest error's first line) of the fallbacks of the last ``seconds``
    (the migration overview)."""
    return conn.execute(_IN_WINDOW, (seconds,)).fetchall()


def newest_fallbacks(conn: psycopg.Connection, ids: list[uuid.UUID]) -> list[tuple]:
    """(dataset, reader, at, error) of each dataset's newest fallback (one index probe each:
    lakehouse_read_fallbacks_dataset_idx)."""
    return conn.execute(
        "select k, f.reader, f.at, f.error from unnest(%s::uuid[]) k cross join lateral"
        " (select reader, at, error from lakehouse_read_fallbacks where dataset_id = k order by at desc limit 1) f",
        (ids,),
    ).fetchall()


_OF_MOVED = sql.SQL("""
    select f.dataset_id, count(*), max(split_part(f.error, E'\\n', 1))
      from lakehouse_read_fallbacks f join moved m on m.id = f.dataset_id
     where f.at >= %(since)s {of_reader}
     group by f.dataset_id""")


def fallbacks_of(conn: psycopg.Connection, moved_cte: sql.Composable, args: dict, *, of_reader: bool) -> list[tuple]:
    """(dataset, count, an error's first line) of the fallbacks since %(since)s on each dataset ``moved_cte`` (an SQL
    ``with moved(id) as (...)``) selects, of the reader %(reader)s only when ``of_reader`` (a rollout plan's stage)."""
    of = sql.SQL("and f.reader = %(reader)s" if of_reader else "")
    return conn.execute(moved_cte + _OF_MOVED.format(of_reader=of), args).fetchall()
