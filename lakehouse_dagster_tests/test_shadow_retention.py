"""Issue 43's remainder: the shadow comparisons are pruned by age and the proofs a flip asks for never change.

The proofs are kept per reader, dataset and schema digest by a trigger on ``lakehouse_shadow_reads`` (migration
0038): checked here against the definition they replaced — the same counts computed from every stored comparison —
before and after pruning, over comparisons written one at a time, many per statement, with failures in between, under
two schemas and for a deleted dataset. Real Postgres, rows as the shadow workers write them."""

from __future__ import annotations

import datetime as dt

import dagster as dg

from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.status.overview import migration_overview
from lakehouse_dagster.flags.proof import SHADOW_KEEP_DAYS, Proof, proofs, prune_shadow_reads, record_shadow_read
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "n", "type": "int64"}]
READERS = ["dashboards.aggregate", "objects.sync", "pipeline.expectations"]

# The proof as it was computed before migration 0038: from every comparison against the dataset's current schema.
FROM_EVERY_COMPARISON = """
with cur as (
  select s.id, s.reader, s.dataset_id, s.outcome, s.at
    from lakehouse_shadow_reads s join datasets d on d.id = s.dataset_id
   where s.reader = any(%(readers)s::text[])
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


def _reference(conn) -> dict:
    return {(r, d): Proof(r, d, *rest) for r, d, *rest in conn.execute(FROM_EVERY_COMPARISON, {"readers": READERS})}


def _digest(conn, d) -> str:
    return conn.execute("select md5(schema::text) from datasets where id = %s", (d,)).fetchone()[0]


def _many(conn, reader, d, outcomes: str, days_ago: float, digest: str) -> None:
    """One statement, one comparison per letter (m match, x mismatch, e error, l lagging, d dropped), a minute apart."""
    names = {"m": "match", "x": "mismatch", "e": "error", "l": "lagging", "d": "dropped"}
    conn.execute(
        "insert into lakehouse_shadow_reads (reader, dataset_id, outcome, schema_digest, at)"
        " select %s, %s, o, %s, now() - make_interval(days => %s) + g * interval '1 minute'"
        " from unnest(%s::text[]) with ordinality u(o, g) order by g",
        (reader, d, digest, days_ago, [names[c] for c in outcomes]),
    )


def _one(conn, reader, d, outcome: str, digest: str) -> None:
    """As a shadow worker writes one (now)."""
    record_shadow_read(conn, (reader, d, outcome, 1, 1, 1, 1, 1, None, None, None, 0.01, None, digest))


def _count(conn, where: str = "true", params: tuple = ()) -> int:
    return conn.execute(f"select count(*) from lakehouse_shadow_reads where {where}", params).fetchone()[0]


def test_pruning_old_comparisons_leaves_every_proof_as_it_was(conn):
    ws = datasets.create_workspace(conn, "ws")
    a, b, gone = (datasets.create_dataset(conn, ws, n, SCHEMA) for n in ("a", "b", "gone"))
    da = _digest(conn, a)
    # a: an old schema's comparisons (they count for nothing now), then the current schema's
    _many(conn, "dashboards.aggregate", a, "mmmx", 40, "an older schema")
    _many(conn, "dashboards.aggregate", a, "mmmmmxmmmlmmdm", 30, da)  # a failure mid-statement
    _many(conn, "dashboards.aggregate", a, "mmemm", 20, da)
    _many(conn, "dashboards.aggregate", a, "mmmmmmmm", 16, da)
    for outcome in ("match", "match", "lagging", "match"):  # recent, one at a time
        _one(conn, "dashboards.aggregate", a, outcome, da)
    # b: objects.sync under a live rollout plan begun 25 days ago; pipeline.expectations never failed
    db = _digest(conn, b)
    _many(conn, "objects.sync", b, "mmmm", 40, db)
    _many(conn, "objects.sync", b, "mmxmm", 20, db)
    _many(conn, "pipeline.expectations", b, "mmmmmmmmmm", 30, db)
    _one(conn, "pipeline.expectations", b, "match", db)
    _many(conn, "dashboards.aggregate", gone, "mmx", 30, _digest(conn, gone))

    before = _reference(conn)
    assert proofs(conn, READERS, None) == before  # the kept proofs are the definition they replaced
    pa = before[("dashboards.aggregate", a)]
    assert (pa.matched, pa.failed, pa.in_a_row) == (26, 2, 2 + 8 + 3)  # 'l' and 'd' count neither way
    pb = before[("pipeline.expectations", b)]
    assert (pb.matched, pb.failed, pb.in_a_row, pb.last_failure) == (11, 0, 11, None)

    conn.execute("delete from datasets where id = %s", (gone,))
    now = conn.execute("select now()").fetchone()[0]
    total = _count(conn)
    pruned = prune_shadow_reads(conn, now=now, live_plans={"objects.sync": now - dt.timedelta(days=25)}, batch=4)

    after = proofs(conn, READERS, None)
    assert after == {k: v for k, v in before.items() if k[1] != gone}  # the same proofs, the deleted dataset's gone
    assert (
        conn.execute("select count(*) from lakehouse_shadow_proofs where dataset_id = %s", (gone,)).fetchone()[0] == 0
    )
    # every comparison older than the retention is gone but a live plan's reader's since its plan and each pair's
    # latest failure (its differing row is what an operator reads); the recent ones are all kept
    old = "at < now() - make_interval(days => %s)"
    kept_old = conn.execute(
        f"select reader, dataset_id, outcome from lakehouse_shadow_reads where {old} order by id", (SHADOW_KEEP_DAYS,)
    ).fetchall()
    assert sorted(kept_old) == sorted(
        [("dashboards.aggregate", a, "error")]  # a's latest failure
        + [("objects.sync", b, o) for o in ("match", "match", "mismatch", "match", "match")]  # the live plan's
    )  # (a deleted dataset's old comparisons all go: no one reads them)
    assert _count(conn, f"not ({old})", (SHADOW_KEEP_DAYS,)) == 4 + 1  # the recent ones
    assert pruned == total - len(kept_old) - 5

    # pruning again removes nothing more; later comparisons still count on top of the kept proofs
    assert prune_shadow_reads(conn, now=now, live_plans={"objects.sync": now - dt.timedelta(days=25)}) == 0
    _many(conn, "dashboards.aggregate", a, "mmx", 0, da)
    p = proofs(conn, READERS, [a])[("dashboards.aggregate", a)]
    assert (p.matched, p.failed, p.in_a_row) == (pa.matched + 2, pa.failed + 1, 0)
    _one(conn, "dashboards.aggregate", a, "match", da)
    assert proofs(conn, READERS, [a])[("dashboards.aggregate", a)].in_a_row == 1

    # the plan ended: its reader's old comparisons go at the next prune (but its latest failure), its proof stays;
    # a's old error goes too, no longer its latest failure
    assert prune_shadow_reads(conn, now=now) == 4 + 1
    assert proofs(conn, ["objects.sync"], [b]) == {("objects.sync", b): before[("objects.sync", b)]}


def test_the_overview_refresh_prunes_the_old_comparisons(conn, dsn, settings):
    """The retention runs where the proofs are read every 5 minutes: the overview asset's refresh."""
    d = datasets.create_dataset(conn, datasets.create_workspace(conn, "ws"), "d", SCHEMA)
    _many(conn, "dashboards.aggregate", d, "mmmmxmm", SHADOW_KEEP_DAYS + 5, _digest(conn, d))
    _one(conn, "dashboards.aggregate", d, "match", _digest(conn, d))
    before = proofs(conn, READERS, [d])
    with dg.DagsterInstance.ephemeral() as instance:
        resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
        assert dg.materialize([migration_overview], instance=instance, resources=resources).success
    assert conn.execute("select outcome from lakehouse_shadow_reads order by id").fetchall() == [
        ("mismatch",),
        ("match",),
    ]
    assert proofs(conn, READERS, [d]) == before and before[("dashboards.aggregate", d)].in_a_row == 3


def test_one_proof_threshold_for_every_process_on_a_database(conn, settings):
    """LAKEHOUSE_SHADOW_PROOF_READS was read per process: a shell with a lower value flipped on less evidence than the
    Dagster processes showed, and nothing recorded it. Now a flip's gate that applies another value stores it
    (audited), and every process then sees and applies that one value; showing it never writes."""
    from lakehouse_dagster.flags.proof import DEFAULT, ENV, STORED, needed_reads, threshold
    from lakehouse_dagster.flags.soak_setting import stored_value

    plain = settings.replace(shadow={"proof_reads": 300, "proof_reads_given": False})  # the daemon: nothing set
    shell = settings.replace(shadow={"proof_reads": 2, "proof_reads_given": True}, project={"actor": "alice"})
    assert threshold(conn, plain) == threshold(conn, plain, applying=True)
    assert (threshold(conn, plain).reads, threshold(conn, plain).source) == (300, DEFAULT)
    assert (threshold(conn, shell).reads, threshold(conn, shell).source) == (2, ENV)  # shown: nothing written
    assert stored_value(conn, "shadow_proof_reads") is None

    assert needed_reads(shell, conn) == 2  # alice's flip applies 2: stored first, for everyone
    t = threshold(conn, plain)
    assert (t.reads, t.source, t.set_by) == (2, STORED, "alice") and needed_reads(plain, conn) == 2
    assert t.describe().startswith("2 in a row (stored for every process: set by alice at ")
    audit = conn.execute(
        "select before_value, after_value, actor from lakehouse_settings_audit where name = 'shadow_proof_reads'"
    ).fetchall()
    assert audit == [(None, 2, "alice")]

    # another shell showing 50 still sees 2; applying 50 stores it (audited), the same value is applied once stored
    strict = settings.replace(shadow={"proof_reads": 50, "proof_reads_given": True}, project={"actor": "bob"})
    assert threshold(conn, strict).reads == 2
    assert needed_reads(strict, conn) == 50 and needed_reads(strict, conn) == 50 and needed_reads(plain, conn) == 50
    assert conn.execute(
        "select count(*) from lakehouse_settings_audit where name = 'shadow_proof_reads'"
    ).fetchone() == (2,)
    assert needed_reads(shell) == 2  # without a connection: this process' own (what `flags list` shows today)


def test_the_partition_page_says_each_compute_readers_shadow_consistency(conn, settings):
    """Issue 43: the consistency rate on the partition page, as of the page's write (its modes_as_of)."""
    from lakehouse_dagster.dagster.defs.shared.partition_metadata import migration_state
    from lakehouse_dagster.flags.overrides import set_override
    from lakehouse_dagster.status.partition_state import partition_state

    ws = datasets.create_workspace(conn, "ws")
    d, quiet = (datasets.create_dataset(conn, ws, n, SCHEMA) for n in ("d", "quiet"))
    digest = _digest(conn, d)
    _many(conn, "dashboards.aggregate", d, "mmmxmm", 1, digest)
    _many(conn, "objects.sync", d, "mmm", 1, "an older schema")  # proves nothing of today's columns
    set_override(conn, "read", "pipeline.expectations", "shadow", dataset=d, actor="pytest")

    line = partition_state(conn, settings, d).shadow_line()
    assert line.startswith("dashboards.aggregate: 83.3% consistent over 6 comparison(s), 2 of 300 in a row"), line
    assert "pipeline.expectations: no shadow read compared yet (0 of 300)" in line, line  # shadowed, nothing yet
    assert "objects.sync" not in line, line
    meta = migration_state(partition_state(conn, settings, d))
    assert meta["shadow_consistency"].value == line
    assert partition_state(conn, settings, quiet).shadow_line().startswith("none")
