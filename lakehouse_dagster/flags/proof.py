"""The proof a compute reader's flip asks for (issue 43): its shadow reads of the dataset compared equal, enough times
in a row, since the dataset's last change of schema.

In read mode ``shadow`` a sample of a reader's reads is also answered by Iceberg and compared (routing/shadow.py,
structured reads by ``compute.compare``'s rule); every comparison is a row of ``lakehouse_shadow_reads`` with the
digest of the schema it ran against. Per reader and dataset, over the comparisons made against the dataset's current
schema (a change of schema restarts the count: what was proven was proven of other columns):

* the **consistency rate**: matches ÷ (matches + mismatches + Iceberg-side errors); ``lagging``, ``no-snapshot``,
  ``not-comparable`` and ``dropped`` count neither way;
* **in a row**: the matches since the latest mismatch or error (all of them when there was none).

A flip of a compute reader to ``iceberg``/``iceberg_only`` for a dataset is refused until *in a row* reaches
``LAKEHOUSE_SHADOW_PROOF_READS`` (default 300): 100 % over at least N comparisons. A mismatch restarts the count
rather than barring the dataset until its schema changes, so a fixed cause can be proven fixed; it costs N clean
comparisons again. Zero failures in 300 independent comparisons bounds the failure rate below 1 % with 95 %
confidence (the rule of three: 3/N).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg
from psycopg import sql

from lakehouse_dagster.core.settings import Settings

_PROOFS = """
with cur as (
  select s.id, s.reader, s.dataset_id, s.outcome, s.at
    from lakehouse_shadow_reads s join datasets d on d.id = s.dataset_id
   where (%(ids)s::uuid[] is null or s.dataset_id = any(%(ids)s::uuid[])) and s.reader = any(%(readers)s::text[])
     and s.outcome in ('match', 'mismatch', 'error') and s.schema_digest = md5(d.schema::text)
), failed as (
  select reader, dataset_id, max(id) as id, max(at) as at from cur where outcome <> 'match' group by 1, 2
)
select c.reader, c.dataset_id,
       count(*) filter (where c.outcome = 'match'),
       count(*) filter (where c.outcome <> 'match'),
       count(*) filter (where c.outcome = 'match' and c.id > coalesce(f.id, 0)),
       max(f.at)
  from cur c left join failed f using (reader, dataset_id)
 group by c.reader, c.dataset_id
"""


@dataclasses.dataclass(frozen=True)
class Proof:
    reader: str
    dataset_id: uuid.UUID
    matched: int = 0  # since the last change of schema
    failed: int = 0  # mismatches and Iceberg-side errors, since the last change of schema
    in_a_row: int = 0  # matches since the latest failure
    last_failure: dt.datetime | None = None

    @property
    def rate(self) -> float | None:
        counted = self.matched + self.failed
        return None if not counted else 100.0 * self.matched / counted

    def proven(self, needed: int) -> bool:
        return self.in_a_row >= needed

    def describe(self, needed: int) -> str:
        if self.rate is None:
            return f"no shadow read compared yet (0 of {needed})"
        head = f"{self.rate:.1f}% consistent over {self.matched + self.failed} comparison(s)"
        if self.proven(needed):
            return f"{head}, {self.in_a_row} in a row: proven"
        since = (
            ""
            if self.last_failure is None
            else f" since the latest failure ({self.last_failure:%Y-%m-%d %H:%M:%S} UTC)"
        )
        return f"{head}, {self.in_a_row} of {needed} in a row{since}"

    def as_dict(self, needed: int) -> dict:
        return {
            "reader": self.reader,
            "dataset_id": str(self.dataset_id),
            "matched": self.matched,
            "failed": self.failed,
            "in_a_row": self.in_a_row,
            "needed": needed,
            "rate": self.rate,
            "proven": self.proven(needed),
            "last_failure": self.last_failure,
        }


def needed_reads(settings: Settings | None = None) -> int:
    """How many comparisons in a row a flip needs: LAKEHOUSE_SHADOW_PROOF_READS of the process making the change."""
    return (settings or Settings.from_env()).shadow_proof_reads


def proofs(
    conn: psycopg.Connection, readers: list[str], dataset_ids: list[uuid.UUID] | None
) -> dict[tuple[str, uuid.UUID], Proof]:
    """{(reader, dataset): its proof}, one query; a pair with no comparison is an empty Proof. ``dataset_ids`` None:
    every dataset with a comparison of these readers (what ``lakehouse flags list`` shows)."""
    out = {(r, d): Proof(r, d) for r in readers for d in dataset_ids or ()}
    if not readers or dataset_ids == []:
        return out
    ids = None if dataset_ids is None else list(dataset_ids)
    for reader, ds, matched, failed, in_a_row, last in conn.execute(
        _PROOFS, {"ids": ids, "readers": list(readers)}
    ).fetchall():
        out[(reader, ds)] = Proof(reader, ds, matched, failed, in_a_row, last)
    return out


# Every statement on lakehouse_shadow_reads is in this module (its owner: lakehouse_dagster_tests/test_table_owners.py):
# routing/shadow.py records the comparisons, the rollout plans' shadow stages count them.


def record_shadow_read(conn: psycopg.Connection, values: tuple) -> None:
    """One comparison: (reader, dataset, outcome, pg version, snapshot, iceberg version, pg rows, iceberg rows,
    first pg row, first iceberg row, detail, seconds, query, schema digest)."""
    conn.execute(
        "insert into lakehouse_shadow_reads (reader, dataset_id, outcome, pg_version, snapshot_id, iceberg_version,"
        " pg_rows, iceberg_rows, pg_row, iceberg_row, detail, seconds, query, schema_digest)"
        " values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        values,
    )


def record_dropped(conn: psycopg.Connection, reader: str, dataset_id: uuid.UUID, n: int, detail: str) -> None:
    """``n`` sampled reads of a reader on a dataset not compared (the shadow queue was full)."""
    conn.execute(
        "insert into lakehouse_shadow_reads (reader, dataset_id, outcome, pg_rows, detail)"
        " values (%s, %s, 'dropped', %s, %s)",
        (reader, dataset_id, n, detail),
    )


def outcomes_since(conn: psycopg.Connection, reader: str, at: dt.datetime) -> list[tuple]:
    """(dataset id, outcome, count) of a reader's shadow reads since ``at``."""
    return conn.execute(
        "select dataset_id, outcome, count(*) from lakehouse_shadow_reads where reader = %s and at >= %s"
        " group by dataset_id, outcome order by dataset_id, outcome",
        (reader, at),
    ).fetchall()


def outcomes_in_window(conn: psycopg.Connection, readers: list[str], seconds: float) -> list[tuple]:
    """(reader, outcome, count) of the last ``seconds`` (the service's /metrics): one range scan of
    lakehouse_shadow_reads_reader_idx per reader, the window's rows whatever the history."""
    return conn.execute(
        "select reader, outcome, count(*) from lakehouse_shadow_reads"
        " where reader = any(%s::text[]) and at >= now() - make_interval(secs => %s)"
        " group by reader, outcome",
        (readers, seconds),
    ).fetchall()


def outcome_counts_and_first_mismatch(
    conn: psycopg.Connection, reader: str, since: dt.datetime, dataset_ids: list[uuid.UUID] | None = None
) -> tuple[dict, tuple | None]:
    """({outcome: count} of a reader's shadow reads since ``since``, on ``dataset_ids`` or all, and the first mismatch
    among them: (dataset_id, at, pg_version, snapshot_id, iceberg_version, pg_row, iceberg_row, detail) or None)."""
    where: sql.Composable = sql.SQL("reader = %s and at >= %s")
    params: list = [reader, since]
    if dataset_ids is not None:
        where += sql.SQL(" and dataset_id = any(%s::uuid[])")
        params.append(dataset_ids)
    counts: dict = dict(
        conn.execute(
            sql.SQL("select outcome, count(*) from lakehouse_shadow_reads where {} group by outcome").format(where),
            params,
        )
    )
    first = conn.execute(
        sql.SQL(
            "select dataset_id, at, pg_version, snapshot_id, iceberg_version, pg_row, iceberg_row, detail"
            " from lakehouse_shadow_reads where {} and outcome = 'mismatch' order by id limit 1"
        ).format(where),
        params,
    ).fetchone()
    return counts, first
