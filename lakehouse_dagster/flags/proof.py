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

The counts are kept per reader, dataset and schema digest in ``lakehouse_shadow_proofs`` by a trigger on every insert
into ``lakehouse_shadow_reads`` (migration 0038): a proof costs one row per pair, and the comparisons themselves can be
pruned (``prune_shadow_reads``, the overview's refresh: older than ``SHADOW_KEEP_DAYS``, except a live rollout plan's
reader and each pair's latest failure) without changing any proof. "In a row" follows the order the trigger counts
them in: a statement's rows by id, two concurrent statements on one pair in the order they lock its row.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg
from psycopg import sql

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.soak_setting import store_value, stored_value, value_history
from lakehouse_dagster.tracking.datasets import fragments

# One row per (reader, dataset, schema digest), kept by a trigger as comparisons are recorded (migration 0038): the
# pairs' rows, never the comparisons (issue 43: the overview's cost grew with the comparisons stored).
_PROOFS = (
    """
select p.reader, p.dataset_id, p.matched, p.failed, p.in_a_row, p.last_failure
  from lakehouse_shadow_proofs p """
    + fragments.join_datasets_on("p.dataset_id")
    + """
 where (%(ids)s::uuid[] is null or p.dataset_id = any(%(ids)s::uuid[])) and p.reader = any(%(readers)s::text[])
   and p.schema_digest = md5(d.schema::text)
"""
)


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


PROOF_READS = "shadow_proof_reads"  # its name in lakehouse_settings
STORED, ENV, DEFAULT = "stored", "LAKEHOUSE_SHADOW_PROOF_READS", "default"


@dataclasses.dataclass(frozen=True)
class Threshold:
    """How many comparisons in a row a flip needs, and where that comes from."""

    reads: int
    source: str  # stored | LAKEHOUSE_SHADOW_PROOF_READS | default
    set_by: str | None = None
    set_at: dt.datetime | None = None

    def describe(self) -> str:
        if self.source == STORED:
            at = f" at {self.set_at:%Y-%m-%d %H:%M:%S} UTC" if self.set_at else ""
            return f"{self.reads} in a row (stored for every process: set by {self.set_by}{at})"
        if self.source == ENV:
            return f"{self.reads} in a row (LAKEHOUSE_SHADOW_PROOF_READS of this process)"
        return f"{self.reads} in a row (the default; nothing stored)"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def threshold(conn: psycopg.Connection, settings: Settings | None = None, *, applying: bool = False) -> Threshold:
    """One threshold for every process on a database: the value stored in lakehouse_settings (flags/soak_setting.py,
    audited), else this process' LAKEHOUSE_SHADOW_PROOF_READS (default 300). A process that *applies* it (a flip's
    gate: ``applying``) with LAKEHOUSE_SHADOW_PROOF_READS set to another value first stores that value, audited with
    its actor: a lower bar set in one shell becomes everyone's, visibly, instead of a private exception to the rule."""
    settings = settings or Settings.from_env()
    stored = stored_value(conn, PROOF_READS)
    if (
        applying
        and settings.shadow.proof_reads_given
        and (stored is None or stored.value != settings.shadow.proof_reads)
    ):
        stored = store_value(
            conn,
            PROOF_READS,
            settings.shadow.proof_reads,
            note=f"LAKEHOUSE_SHADOW_PROOF_READS of a process applying it (was {stored.value if stored else 'unset'})",
            actor=settings.project.actor or "unknown",
        )
    if stored is not None:
        return Threshold(int(str(stored.value)), STORED, stored.set_by, stored.set_at)
    return Threshold(settings.shadow.proof_reads, ENV if settings.shadow.proof_reads_given else DEFAULT)


MAX_PROOF_READS = 1_000_000  # a bar no reader's sampled reads reach in months: anything above is a typo


def check_reads(reads: object) -> int:
    """A threshold in whole comparisons, 1 to MAX_PROOF_READS; BadInput naming what was wrong."""
    try:
        value = int(str(reads).strip())
    except ValueError:
        raise BadInput(
            f"shadow proof threshold {reads!r} is not a whole number of comparisons (e.g. 300, the default)"
        ) from None
    if value < 1:
        raise BadInput(f"shadow proof threshold {value} is below 1; a flip needs at least one comparison in a row")
    if value > MAX_PROOF_READS:
        raise BadInput(
            f"shadow proof threshold {value} is over {MAX_PROOF_READS:,}; give the comparisons in a row, e.g. 300"
        )
    return value


def set_threshold(
    conn: psycopg.Connection, reads: object, *, note: str | None, actor: str | None
) -> tuple[Threshold | None, Threshold]:
    """Store the threshold for every process on the database (audited); (before, after). Validates the value, the
    note and the actor before writing anything."""
    value = check_reads(reads)
    note = (note or "").strip() or None
    if note and len(note) > 1000:
        raise BadInput(f"--note is {len(note)} characters; keep it under 1000")
    if not actor or not actor.strip():
        raise BadInput("no actor: set LAKEHOUSE_ACTOR to who is making the change")
    before = stored_value(conn, PROOF_READS)
    after = store_value(conn, PROOF_READS, value, note=note, actor=actor.strip())
    was = None if before is None else Threshold(int(str(before.value)), STORED, before.set_by, before.set_at)
    return was, Threshold(value, STORED, after.set_by, after.set_at)


def threshold_history(conn: psycopg.Connection, limit: int = 20) -> list[dict]:
    """The threshold's audit, newest first: every store, by this verb or by a gate applying its process' value."""
    return value_history(conn, PROOF_READS, limit)


def needed_reads(settings: Settings | None = None, conn: psycopg.Connection | None = None) -> int:
    """How many comparisons in a row a flip needs: with a connection, the one value of every process on the database
    (``threshold``, as a flip's gate applies it); without, LAKEHOUSE_SHADOW_PROOF_READS of this process."""
    if conn is not None:
        return threshold(conn, settings, applying=True).reads
    return (settings or Settings.from_env()).shadow.proof_reads


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


# The comparisons kept: the rollout analyses and /metrics read recent ones (a stage since its flip, the last hour), an
# operator the latest failure's differing row; the proofs do not read them at all (lakehouse_shadow_proofs).
SHADOW_KEEP_DAYS = 14
PRUNE_BATCH = 10_000  # rows per delete: short transactions beside the shadow workers' inserts
PRUNE_BATCHES = 50  # per call: a tick does at most this many (500,000 rows), the next one goes on

_PRUNE = (
    """
with doomed as (
  select s.id from lakehouse_shadow_reads s
   where s.at < %(before)s
     and not exists (select 1 from unnest(%(readers)s::text[], %(since)s::timestamptz[]) k(reader, since)
                      where k.reader = s.reader and s.at >= k.since)
     and (s.outcome not in ('mismatch', 'error')
          or not """
    + fragments.dataset_exists("s.dataset_id")
    + """
          or s.id <> (select max(f.id) from lakehouse_shadow_reads f
                       where f.reader = s.reader and f.dataset_id = s.dataset_id and f.outcome in ('mismatch', 'error')))
   order by s.id
   limit %(batch)s)
delete from lakehouse_shadow_reads where id in (select id from doomed)
"""
)


def prune_shadow_reads(
    conn: psycopg.Connection,
    *,
    now: dt.datetime,
    keep: dt.timedelta = dt.timedelta(days=SHADOW_KEEP_DAYS),
    live_plans: dict[str, dt.datetime] | None = None,
    batch: int = PRUNE_BATCH,
    batches: int = PRUNE_BATCHES,
) -> int:
    """Delete the comparisons older than ``keep`` but those of a reader with a live rollout plan since the plan began
    (``live_plans``: reader → its plan's creation; its analyses count a stage's comparisons) and each reader and
    existing dataset's latest failure (its differing row); and the proofs of datasets that no longer exist. Each batch commits on its own (the
    connection is in autocommit, or the caller's transaction holds them all). How many comparisons went."""
    plans = sorted((live_plans or {}).items())
    params = {
        "before": now - keep,
        "readers": [r for r, _ in plans],
        "since": [at for _, at in plans],
        "batch": batch,
    }
    gone = 0
    for _ in range(batches):
        n = conn.execute(_PRUNE, params).rowcount
        gone += n
        if n < batch:
            break
    conn.execute("delete from lakehouse_shadow_proofs p where not " + fragments.dataset_exists("p.dataset_id"))
    return gone
