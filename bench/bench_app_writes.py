"""What the live app pays for its writes: INSERT / UPDATE / DELETE on dataset_rows with change tracking
and the maintained parity digest beside the same statements without them.

    nice .venv/bin/python bench/bench_app_writes.py [--rows 100000] [--statements 200] [--rounds 3]

A demo-shaped dataset (bench/_common.py) of --rows rows, registered for the maintained digest. Each
statement is its own transaction (autocommit), as the app's writes are. Three configurations, measured in
the same run, alternating round by round (the best round of each is kept):
  bare       every lakehouse trigger disabled (the app's table as it was: primary key and foreign key only)
  floor      only an empty plpgsql statement trigger per event with the same transition tables: the fixed
             cost any statement-level change capture pays (the floor under "tracking" and "digest")
  hash       only a statement trigger summing the row hash of the statement's rows with a static query
             (plan cached): the arithmetic the maintained digest cannot avoid, without any of its bookkeeping
  tracking   change tracking only (the digest triggers disabled)
  track-020  change tracking as it was before migration 023 (020's functions under other names): the
             baseline of 023's one-statement append
  before-020 change tracking + the maintained digest as they were before migration 020 (018's and 015's
             functions, installed beside the current ones under other names): the baseline of 020
  digest     change tracking + the maintained digest in the app's transaction (capture mode "triggers")
  tracking-full  change tracking only, REPLICA IDENTITY FULL on dataset_rows: what the app paid in the
             previous release's capture mode "wal" (the digest after the commit, tracking in the transaction;
             removed since), kept as the reference for what moving the tracking out saves
  after-commit  the barrier triggers of migration 024 only (a shared transaction-level advisory lock per
             dataset the statement wrote), REPLICA IDENTITY FULL: what the app pays in capture mode
             "after-commit", where change tracking and the digest are both written by the WAL consumer
             (tracking/capture/) and readers pin behind the barrier (tracking/barrier.py); that consumer's
             own time per statement is measured after the rounds and printed separately
  barrier    the first form of that trigger, before it shipped (a one-dataset fast path, hashtextextended
             on the uuid's text), REPLICA IDENTITY DEFAULT: the design point measured in session 9
  after-commit-key  after-commit's triggers with REPLICA IDENTITY DEFAULT: what the old row images of
             REPLICA IDENTITY FULL (for the digest's subtraction) cost the app
  barrier-row   the same lock from a row-level trigger (no transition tables): cheaper for one row, dearer
             for many (one trigger call per row); not shipped
The server runs with wal_level = logical in every configuration (the embedded server always does).
Two clocks: the wall time of a statement as the app sees it, and the CPU time of the Postgres backend
serving it (/proc/<pid>/schedstat, when the server runs on this machine), which is what the triggers add
and moves much less than wall time when other work shares the machine.
synchronous_commit is off in the bench session (the WAL flush per commit is the same in all three).
Prints per statement kind the time per statement and the ratios to bare (target ≤ 1.3 ×).
Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import admin_dsn, fresh_database, make_dataset  # noqa: E402

ROW = {
    "name": "item-x",
    "label": "ünïcode ✓ 日本",
    "qty": 42,
    "bucket": 7,
    "price": 1.25,
    "ratio": 0.5,
    "active": True,
    "seen_at": "2024-05-01T10:00:00.123456+02:00",
    "day": "2024-05-01",
    "attrs": {"a": 1, "tags": ["x", 2, None], "nested": {"k": 0, "ü": "v"}},
}
DIGEST_TRIGGERS = (
    "lakehouse_rows_ins_digest",
    "lakehouse_rows_upd_digest",
    "lakehouse_rows_del_digest",
    "lakehouse_rows_trunc_digest",
)
TRACKING_TRIGGERS = ("lakehouse_rows_ins", "lakehouse_rows_upd", "lakehouse_rows_del", "lakehouse_rows_trunc")
EVENTS = (
    ("ins", "insert", "new table as lakehouse_new_rows"),
    ("upd", "update", "old table as lakehouse_old_rows new table as lakehouse_new_rows"),
    ("del", "delete", "old table as lakehouse_old_rows"),
)
CONFIGS = {
    "bare": (),
    "floor": tuple(f"bench_floor_{e}" for e, _, _ in EVENTS),
    "hash": tuple(f"bench_hash_{e}" for e, _, _ in EVENTS),
    "tracking": TRACKING_TRIGGERS,
    "track-020": tuple(f"bench_track020_{e}" for e, _, _ in EVENTS),
    "before-020": tuple(f"bench_before_{i}_{e}" for e, _, _ in EVENTS for i in (1, 2)),
    "digest": TRACKING_TRIGGERS + DIGEST_TRIGGERS,
    "barrier": tuple(f"bench_barrier_{e}" for e, _, _ in EVENTS),
    "tracking-full": TRACKING_TRIGGERS,
    "after-commit": ("lakehouse_rows_barrier_ins", "lakehouse_rows_barrier_upd", "lakehouse_rows_barrier_del"),
    "barrier-row": tuple(f"bench_barrier_row_{e}" for e, _, _ in EVENTS),
    "after-commit-key": ("lakehouse_rows_barrier_ins", "lakehouse_rows_barrier_upd", "lakehouse_rows_barrier_del"),
}
FULL_IDENTITY = ("tracking-full", "after-commit")


def install_reference_triggers(conn, hash_sql: str) -> None:
    """Under bench-only names, disabled (``configure`` enables what a configuration needs): the floor (an
    empty statement trigger with transition tables), the bare row hash of the statement's rows (static SQL),
    the triggers as they were before migration 020 (018's change tracking, 015's digest; same firing
    order: tracking, then digest), and change tracking as it was before migration 023 (020's)."""
    from lakehouse_dagster.schema.migrate import migration_sql

    NO_KEY_ROW_LOCKS = migration_sql("018_no_key_row_locks")
    ONE_DATASET_TRACKING = migration_sql("020_app_write_cost")
    DIGESTS = migration_sql("015_parity_digests")

    def function(text: str, name: str, as_name: str) -> str:
        start = text.index(f"create or replace function {name}()")
        return text[start : text.index("end $$;", start) + len("end $$;")].replace(f"{name}()", f"{as_name}()")

    conn.execute(function(NO_KEY_ROW_LOCKS, "lakehouse_rows_inserted", "bench_rows_inserted_018"))
    conn.execute(function(NO_KEY_ROW_LOCKS, "lakehouse_rows_rewritten", "bench_rows_rewritten_018"))
    conn.execute(function(DIGESTS, "lakehouse_digest_rows", "bench_digest_rows_015"))
    conn.execute(function(ONE_DATASET_TRACKING, "lakehouse_rows_inserted", "bench_rows_inserted_020"))
    conn.execute(function(ONE_DATASET_TRACKING, "lakehouse_rows_rewritten", "bench_rows_rewritten_020"))
    conn.execute(
        "create or replace function bench_floor() returns trigger language plpgsql as $$ begin return null; end $$"
    )
    for e, table in (("ins", "lakehouse_new_rows"), ("del", "lakehouse_old_rows")):
        conn.execute(
            f"create or replace function bench_hash_{e}() returns trigger language plpgsql as $$"
            f" begin perform sum({hash_sql}) from {table}; return null; end $$"
        )
    conn.execute(
        f"create or replace function bench_hash_upd() returns trigger language plpgsql as $$ begin"
        f" perform sum({hash_sql}) from lakehouse_new_rows; perform sum({hash_sql}) from lakehouse_old_rows;"
        f" return null; end $$"
    )
    for e, tables in (
        ("ins", ("lakehouse_new_rows",)),
        ("upd", ("lakehouse_new_rows", "lakehouse_old_rows")),
        ("del", ("lakehouse_old_rows",)),
    ):
        rows = " union all ".join(f"select dataset_id from {t}" for t in tables)
        conn.execute(f"""create or replace function bench_barrier_{e}() returns trigger language plpgsql as $$
            declare one uuid; k bigint;
            begin
              select dataset_id, count(*) over () into one, k from ({rows}) t group by dataset_id limit 1;
              if k = 1 then
                perform pg_advisory_xact_lock_shared(hashtextextended(one::text, 0));
              else
                perform pg_advisory_xact_lock_shared(hashtextextended(d::text, 0))
                   from (select distinct dataset_id as d from ({rows}) t order by 1) s;
              end if;
              return null;
            end $$""")
    conn.execute("""create or replace function bench_barrier_row() returns trigger language plpgsql as $$
        begin
          if tg_op <> 'DELETE' then
            perform pg_advisory_xact_lock_shared(uuid_hash_extended(new.dataset_id, 0));
          end if;
          if tg_op <> 'INSERT' and (tg_op = 'DELETE' or old.dataset_id is distinct from new.dataset_id) then
            perform pg_advisory_xact_lock_shared(uuid_hash_extended(old.dataset_id, 0));
          end if;
          return null;
        end $$""")
    for e, event, _ in EVENTS:
        conn.execute(
            f"create trigger bench_barrier_row_{e} after {event} on dataset_rows"
            f" for each row execute function bench_barrier_row()"
        )
    for e, event, ref in EVENTS:
        tracking = "bench_rows_inserted_018" if e == "ins" else "bench_rows_rewritten_018"
        tracking_020 = "bench_rows_inserted_020" if e == "ins" else "bench_rows_rewritten_020"
        for name, fn in (
            (f"bench_floor_{e}", "bench_floor"),
            (f"bench_hash_{e}", f"bench_hash_{e}"),
            (f"bench_barrier_{e}", f"bench_barrier_{e}"),
            (f"bench_track020_{e}", tracking_020),
            (f"bench_before_1_{e}", tracking),
            (f"bench_before_2_{e}", "bench_digest_rows_015"),
        ):
            conn.execute(
                f"create trigger {name} after {event} on dataset_rows referencing {ref}"
                f" for each statement execute function {fn}()"
            )


def backend_cpu_ns(pid: int) -> int | None:
    """CPU time the backend has run, in ns (None when the server is not on this machine)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def main(argv=None) -> int:  # noqa: C901
    """Complex on purpose: a bench script: argument parsing, setup, rounds and report read top to bottom."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--statements", type=int, default=200, help="statements per kind per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset (bare is always run)")
    args = ap.parse_args(argv)

    from psycopg import sql
    from psycopg.types.json import Jsonb

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.parity import maintained
    from lakehouse_dagster.tracking.datasets import get_dataset

    admin = admin_dsn()
    name = "lakehouse_bench_app_writes"
    dsn = fresh_database(admin, name)
    ds_id, _ = make_dataset(dsn, args.rows)
    conn = connect(dsn)
    # Commit latency (a WAL flush per statement) is the same for all three and only adds noise on a shared
    # machine: the triggers' cost is CPU inside the statement.
    conn.execute("set synchronous_commit = off")
    print(
        f"rows: {args.rows:,}; {args.statements} statements per kind per round, {args.rounds} rounds "
        f"(machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f})",
        flush=True,
    )
    print("registered + filled:", maintained.ensure_pg(conn, ds_id, get_dataset(conn, ds_id).columns), flush=True)

    install_reference_triggers(
        conn,
        conn.execute("select hash_sql from lakehouse_pg_digest_state where dataset_id = %s", (ds_id,)).fetchone()[0],
    )
    pid = conn.execute("select pg_backend_pid()").fetchone()[0]

    def configure(cfg: str) -> None:
        with conn.transaction():
            conn.execute("alter table dataset_rows disable trigger user")
            for t in CONFIGS[cfg]:  # the digest and barrier triggers are ENABLE ALWAYS (migrations 015, 024)
                how = "enable always trigger" if t in DIGEST_TRIGGERS or "barrier" in t else "enable trigger"
                conn.execute(sql.SQL("alter table dataset_rows {} {}").format(sql.SQL(how), sql.Identifier(t)))
            conn.execute("alter table dataset_rows replica identity " + ("full" if cfg in FULL_IDENTITY else "default"))

    row = Jsonb(ROW)
    k = args.statements
    next_index = {"v": args.rows + 1_000_000}

    def workloads():
        """(kind, [statement params...]); each runs on rows it created itself, leaving the dataset as it was."""
        base = next_index["v"]
        next_index["v"] += 1_000_000
        singles = [base + i for i in range(k)]
        batches = [[base + 100_000 + i * 100 + j for j in range(100)] for i in range(k // 10)]
        ins = "insert into dataset_rows (dataset_id, row_index, data) select %s, i, %s from unnest(%s::bigint[]) i"
        upd = (
            "update dataset_rows set data = data || jsonb_build_object('qty', row_index %% 1000)"
            " where dataset_id = %s and row_index = any(%s::bigint[])"
        )
        dele = "delete from dataset_rows where dataset_id = %s and row_index = any(%s::bigint[])"
        return [
            ("INSERT 1 row", ins, [(ds_id, row, [i]) for i in singles]),
            ("INSERT 100 rows", ins, [(ds_id, row, b) for b in batches]),
            ("UPDATE 1 row", upd, [(ds_id, [i]) for i in singles]),
            ("UPDATE 100 rows", upd, [(ds_id, b) for b in batches]),
            ("DELETE 1 row", dele, [(ds_id, [i]) for i in singles]),
            ("DELETE 100 rows", dele, [(ds_id, b) for b in batches]),
        ]

    configs = tuple(dict.fromkeys(["bare", *args.configs.split(",")]))
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    best: dict[tuple[str, str], float] = {}
    cpu: dict[tuple[str, str], float] = {}
    for rnd in range(args.rounds):
        for cfg in configs if rnd % 2 == 0 else configs[::-1]:
            configure(cfg)
            for kind, stmt, params in workloads():
                c0, t = backend_cpu_ns(pid), time.perf_counter()
                for p in params:
                    conn.execute(stmt, p)
                per = (time.perf_counter() - t) / len(params)
                best[(cfg, kind)] = min(best.get((cfg, kind), per), per)
                if c0 is not None:
                    per_cpu = (backend_cpu_ns(pid) - c0) / 1e9 / len(params)
                    cpu[(cfg, kind)] = min(cpu.get((cfg, kind), per_cpu), per_cpu)
    configure("digest")
    with connect(dsn) as c:  # the shipped configuration kept the sums right all along
        from lakehouse_dagster.testing.parity import pg_maintained, pg_reference

        agree = pg_maintained(dsn, ds_id) == pg_reference(dsn, ds_id)
        deltas = c.execute(
            "select count(*) from lakehouse_pg_digest_deltas where dataset_id = %s", (ds_id,)
        ).fetchone()[0]

    # The WAL consumer: the same statements once more in capture mode "after-commit", then its catch-up, timed.
    from lakehouse_dagster.tracking import capture

    conn.execute("set synchronous_commit = on")  # the consumer decodes flushed WAL only
    consumers: dict[str, dict[str, tuple[float, float | None]]] = {}
    wal_agree = True
    for mode in (capture.AFTER_COMMIT,):
        capture.enable(conn)
        consumer = consumers[mode] = {}
        for kind, stmt, params in workloads():
            for p in params:
                conn.execute(stmt, p)
            c0, t = backend_cpu_ns(pid), time.perf_counter()
            capture.catch_up(conn)
            consumer[kind] = (
                (time.perf_counter() - t) / len(params),
                None if c0 is None else (backend_cpu_ns(pid) - c0) / 1e9 / len(params),
            )
        wal_agree = wal_agree and pg_maintained(dsn, ds_id) == pg_reference(dsn, ds_id)
        capture.disable(conn)

    kinds = [w[0] for w in workloads()]
    worst: dict[str, float] = {}
    for clock, table in (
        ("wall time per statement (what the app waits)", best),
        ("Postgres backend CPU per statement", cpu),
    ):
        if not table:
            continue
        print(f"\n{clock}, ms; in brackets × bare")
        print(f"{'statement':16s}" + "".join(f"{c:>18s}" for c in configs))
        for kind in kinds:
            b = table[("bare", kind)]
            print(
                f"{kind:16s}"
                + "".join(f"{table[(c, kind)] * 1000:9.3f} ({table[(c, kind)] / b:5.2f}×)" for c in configs)
            )
        worst = {c: max(table[(c, k)] / table[("bare", k)] for k in kinds) for c in configs if c != "bare"}
    for mode, consumer in consumers.items():
        print(
            f"\nthe WAL consumer, after the commit (capture mode {mode}), per statement: wall ms (its backend's CPU ms)"
        )
        for kind in kinds:
            w, c = consumer[kind]
            print(f"{kind:16s}{w * 1000:9.3f} ({'-' if c is None else f'{c * 1000:.3f}'})")
    print(
        "\nworst × bare (the last clock above), target ≤ 1.3×: " + ", ".join(f"{c} {w:.2f}×" for c, w in worst.items())
    )
    print(
        f"maintained sums equal a full digest: triggers {agree}, WAL consumer {wal_agree}; {deltas} delta rows before compaction"
    )
    conn.close()
    with connect(admin) as c:
        c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
    return 0 if agree and wal_agree else 1


if __name__ == "__main__":
    sys.exit(main())
