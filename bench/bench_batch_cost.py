"""Per-dataset cost inside a mirror batch run (issue 11), against main's code measured in the same run.

    .venv/bin/python bench/bench_batch_cost.py [--n 25,100,1000] [--rows 1000] [--append 10] [--baseline REV]
    .venv/bin/python bench/bench_batch_cost.py --compare-capture [--n 100]   # capture mode triggers vs after-commit

For each N: N datasets of ``--rows`` rows are written, then mirrored by real ``mirror_batch_job`` runs executed in
process (no daemon, no run start-up: that is the `warm` branch's) in batches of LAKEHOUSE_MIRROR_BATCH_SIZE as
the poller would request them, on a Dagster instance with Postgres storage (as dagster.yaml configures); then
``--append`` rows are appended to every dataset and the batches run again. Each (code, N) runs in a fresh child
process against a fresh database: ``current`` is this checkout, ``baseline`` is ``git archive`` of --baseline
(default: the merge-base with main) put first on PYTHONPATH. Printed per pass: wall seconds, datasets/s, and the
per-dataset milliseconds inside each named function (inclusive: a row includes the rows nested in it), then the
ratios baseline/current. ``--only current`` skips the baseline (N=1000 takes about 20-30 minutes per variant on a
2-core machine shared with other work). Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (module, attribute, label): timed where the caller looks them up. Missing ones (other code) are skipped.
TIMED = [
    ("lakehouse_dagster.mirror.batch", "sync_dataset", "sync (all)"),
    ("lakehouse_dagster.mirror.sync", "guard_connection", "sync: connect (guard)"),
    ("lakehouse_dagster.core.guards", "guard_connection", "sync: connect (guard)"),
    ("lakehouse_dagster.mirror.sync", "refuse_mirror_over_iceberg_only", "sync: iceberg_only test"),
    ("lakehouse_dagster.mirror.sync", "reap_abandoned", "sync: reaper"),
    ("lakehouse_dagster.mirror.sync", "_log_start", "sync: log start"),
    ("lakehouse_dagster.mirror.sync", "_mirror", "sync: read+write+commit"),
    ("lakehouse_dagster.mirror.sync", "write_digested", "sync:   write+commit"),
    ("lakehouse_dagster.mirror.sync", "_log_succeeded", "sync: log succeeded"),
    ("lakehouse_dagster.dagster.defs.mirror.mirror_batch", "get_dataset", "op: dataset row for metadata"),
    ("lakehouse_dagster.dagster.defs.mirror.mirror_batch", "check_evaluations", "checks (all)"),
    ("lakehouse_dagster.dagster.defs.parity.checks", "parity_result", "check: parity"),
    ("lakehouse_dagster.parity.canary", "_prepare_maintained", "check:   parity prepare maintained"),
    ("lakehouse_dagster.tracking.capture", "catch_up", "check:     WAL consumer catch-up"),
    ("lakehouse_dagster.parity.canary", "_compare", "check:   parity compare"),
    ("lakehouse_dagster.dagster.defs.parity.checks", "freshness_result", "check: snapshot_freshness"),
    ("lakehouse_dagster.dagster.defs.parity.checks", "identity_result", "check: identity_ready"),
    ("lakehouse_dagster.parity.digest", "pin_iceberg", "iceberg: pin (load table + plan files)"),
    ("lakehouse_dagster.lake.catalog", "load_table_or_none", "iceberg: load table"),
    ("lakehouse_dagster.core.db", "connect", "postgres: connect (psycopg)"),
]
EVENT_WRITES = "dagster: event writes"
# Counted (and timed) below every caller, whatever the code version: the calls/ds column is the firm part.
CATALOG_LOADS = "iceberg: catalog.load_table (all callers)"
PG_CONNECTS = "postgres: psycopg connects (all)"
ADBC_CONNECTS = "postgres: ADBC reader connects"
DAGSTER_CONNECTS = "dagster: new storage connections"
COUNTED = [CATALOG_LOADS, PG_CONNECTS, ADBC_CONNECTS, DAGSTER_CONNECTS]


class Timers:
    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, fn, label):
        if getattr(fn, "__bench_wrapped__", False):
            return fn

        @functools.wraps(fn)
        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - t
                self.calls[label] = self.calls.get(label, 0) + 1

        timed.__bench_wrapped__ = True
        return timed

    def install(self):
        import importlib
        import sys as _sys

        for mod_name, attr, label in TIMED:
            mod = importlib.import_module(mod_name)
            fn = getattr(mod, attr, None)
            if fn is None:
                continue
            wrapped = self.wrap(fn, label)
            # wherever the function was imported by name, time it there too
            for m in list(_sys.modules.values()):
                if getattr(m, "__name__", "").startswith("lakehouse_dagster") and getattr(m, attr, None) is fn:
                    setattr(m, attr, wrapped)
        from dagster._core.instance import DagsterInstance

        DagsterInstance.handle_new_event = self.wrap(DagsterInstance.handle_new_event, EVENT_WRITES)

        import adbc_driver_postgresql.dbapi as adbc
        import psycopg
        import sqlalchemy
        from pyiceberg.catalog.sql import SqlCatalog

        SqlCatalog.load_table = self.wrap(SqlCatalog.load_table, CATALOG_LOADS)
        psycopg.Connection.connect = classmethod(self.wrap(psycopg.Connection.connect.__func__, PG_CONNECTS))
        psycopg.connect = psycopg.Connection.connect
        adbc.connect = self.wrap(adbc.connect, ADBC_CONNECTS)
        dagster_db = urlparse_db(os.environ.get("BENCH_DAGSTER_DB", ""))

        def pool_connect(dbapi_conn, record):  # new DBAPI connections of SQLAlchemy pools to Dagster's database
            info = getattr(dbapi_conn, "info", None)
            if getattr(info, "dbname", None) == dagster_db:
                self.calls[DAGSTER_CONNECTS] = self.calls.get(DAGSTER_CONNECTS, 0) + 1

        sqlalchemy.event.listen(sqlalchemy.pool.Pool, "connect", pool_connect)

    def reset(self):
        self.seconds.clear()
        self.calls.clear()


def urlparse_db(dsn: str) -> str:
    return dsn.split("?")[0].rsplit("/", 1)[-1]


def _datasets(dsn: str, n: int, rows: int) -> list[str]:
    from bench._common import BENCH_SCHEMA, GENERATE
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.tracking import datasets

    with connect(dsn) as conn:
        ws = datasets.create_workspace(conn, "bench")
        ids = [datasets.create_dataset(conn, ws, f"b{i}", BENCH_SCHEMA) for i in range(n)]
        for d in ids:
            conn.execute(GENERATE, {"ds": d, "lo": 0, "hi": rows - 1})
        conn.execute("vacuum analyze dataset_rows")
    return [str(d) for d in ids]


def _append(dsn: str, ids: list[str], rows: int, append: int) -> None:
    from bench._common import GENERATE
    from lakehouse_dagster.core.db import connect

    with connect(dsn) as conn:
        for d in ids:
            conn.execute(GENERATE, {"ds": d, "lo": rows, "hi": rows + append - 1})


def child(args) -> dict:
    from bench._common import fresh_database

    dsn = fresh_database(args.admin, args.db)
    dagster_dsn = fresh_database(args.admin, args.db + "_dagster")
    os.environ["BENCH_DAGSTER_DB"] = args.db + "_dagster"
    home = Path(tempfile.mkdtemp(prefix="lh-bench-dagster-"))
    from lakehouse_dagster.cli.dsn import dagster_url

    (home / "dagster.yaml").write_text(
        f"storage:\n  postgres:\n    postgres_url: {json.dumps(dagster_url(dagster_dsn))}\n"
        "telemetry:\n  enabled: false\n"
    )
    os.environ["LAKEHOUSE_WAREHOUSE"] = Path(tempfile.mkdtemp(prefix="lh-bench-wh-")).as_uri()
    os.environ["LAKEHOUSE_PG_DSN"] = dsn

    import dagster as dg

    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.dagster.defs.mirror.mirror_batch import mirror_batch_job
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource
    from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions

    instance = dg.DagsterInstance.from_config(str(home))
    ids = _datasets(dsn, args.n, args.rows)
    if args.capture == "after-commit":  # tracking and the digest written after the commit (tracking/capture/)
        from lakehouse_dagster.core.db import connect
        from lakehouse_dagster.tracking import capture

        with connect(dsn) as c:
            capture.enable(c)
    instance.add_dynamic_partitions(datasets_partitions.name, ids)
    size = Settings.from_env().mirror.batch_size or 25
    timers = Timers()
    timers.install()
    resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
    out = {}
    for phase in ("first", "append"):
        if phase == "append":
            _append(dsn, ids, args.rows, args.append)
        timers.reset()
        failed = 0
        t = time.perf_counter()
        for i in range(0, len(ids), size):
            batch = ids[i : i + size]
            r = mirror_batch_job.execute_in_process(
                run_config={"ops": {"mirror_datasets": {"config": {"datasets": batch}}}},
                resources=resources,
                instance=instance,
                raise_on_error=False,
            )
            failed += 0 if r.success else 1
        wall = time.perf_counter() - t
        checks = _verdicts(instance, ids)
        out[phase] = {
            "wall": wall,
            "failed_runs": failed,
            "seconds": dict(timers.seconds),
            "calls": dict(timers.calls),
            "verdicts": checks,
        }
    instance.dispose()
    if args.capture == "after-commit":
        with connect(dsn) as c:  # drops the slot (it would block dropping the database)
            capture.disable(c)
    return out


def _verdicts(instance, ids: list[str]) -> dict:
    """How many check evaluations passed / failed, per check name (the same verdicts before and after)."""
    from dagster import DagsterEventType, EventRecordsFilter

    recs = instance.get_event_records(EventRecordsFilter(DagsterEventType.ASSET_CHECK_EVALUATION), limit=100000)
    counts: dict[str, int] = {}
    for r in recs:
        e = r.event_log_entry.dagster_event.event_specific_data
        key = f"{e.check_name}:{'passed' if e.passed else 'failed'}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def _baseline_tree(rev: str) -> Path:
    out = Path(tempfile.mkdtemp(prefix="lh-bench-base-"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "lakehouse_dagster"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def run_child(code: Path, admin: str, n: int, rows: int, append: int, db: str, capture: str = "triggers") -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), str(ROOT)])}
    env.pop("LAKEHOUSE_PG_DSN", None)
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--admin",
        admin,
        "--db",
        db,
        "--n",
        str(n),
        "--rows",
        str(rows),
        "--append",
        str(append),
        "--capture",
        capture,
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"child failed ({code}, n={n}):\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def report(n: int, base: dict, cur: dict) -> None:
    for phase in ("first", "append"):
        b, c = base[phase], cur[phase]
        print(f"\n== N={n} datasets, {phase} sync ==")
        print(
            f"  wall: baseline {b['wall']:.1f} s ({n / b['wall']:.2f} datasets/s), current {c['wall']:.1f} s "
            f"({n / c['wall']:.2f} datasets/s); baseline/current = {b['wall'] / c['wall']:.2f}x"
        )
        print(f"  failed runs: baseline {b['failed_runs']}, current {c['failed_runs']}")
        print(f"  check verdicts: baseline {json.dumps(b['verdicts'], sort_keys=True)}")
        print(f"                  current  {json.dumps(c['verdicts'], sort_keys=True)}")
        print(f"  {'ms per dataset (inclusive)':44s} {'baseline':>9s} {'current':>9s} {'ratio':>6s}   calls/ds b→c")
        labels = [label for _, _, label in TIMED] + [EVENT_WRITES] + COUNTED
        for label in dict.fromkeys(labels):
            bs, cs = b["seconds"].get(label), c["seconds"].get(label)
            if bs is None and cs is None and label not in COUNTED:
                continue
            bms = 1000 * (bs or 0) / n
            cms = 1000 * (cs or 0) / n
            ratio = f"{bms / cms:5.1f}x" if cms else "   - "
            calls = f"{b['calls'].get(label, 0) / n:.1f}→{c['calls'].get(label, 0) / n:.1f}"
            print(f"  {label:44s} {bms:9.1f} {cms:9.1f} {ratio}   {calls}")
        parts = ("sync (all)", "checks (all)", EVENT_WRITES)
        bt = 1000 * sum(b["seconds"].get(k, 0.0) for k in parts) / n
        ct = 1000 * sum(c["seconds"].get(k, 0.0) for k in parts) / n
        print(f"  {'sync + checks + event writes':44s} {bt:9.1f} {ct:9.1f} {bt / ct:5.1f}x" if ct else "")
        print(
            f"  {'wall per dataset':44s} {1000 * b['wall'] / n:9.1f} {1000 * c['wall'] / n:9.1f} "
            f"{b['wall'] / c['wall']:5.1f}x"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="25,100")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--append", type=int, default=10)
    ap.add_argument("--baseline", default=None, help="git revision of the baseline (default: merge-base with main)")
    ap.add_argument("--only", choices=("baseline", "current"), default=None)
    ap.add_argument(
        "--capture",
        choices=("triggers", "after-commit"),
        default="triggers",
        help="capture mode of the maintained digest for the current code (tracking/capture/)",
    )
    ap.add_argument(
        "--compare-capture",
        action="store_true",
        help="baseline = this checkout in capture mode triggers, current = this checkout in capture mode after-commit",
    )
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--admin")
    ap.add_argument("--db")
    args = ap.parse_args()
    if args.child:
        args.n = int(args.n)
        print(json.dumps(child(args)))
        return
    sys.path.insert(0, str(ROOT))
    from bench._common import admin_dsn

    rev = (
        args.baseline
        or subprocess.run(
            ["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    base_tree = _baseline_tree(rev)
    admin = admin_dsn()
    if args.compare_capture:
        print(
            f"baseline: {ROOT} in capture mode triggers, current: the same in capture mode after-commit; "
            f"rows/dataset {args.rows}, append {args.append}"
        )
    else:
        print(
            f"baseline: {rev[:10]} (git archive), current: {ROOT} (capture mode {args.capture}); "
            f"rows/dataset {args.rows}, append {args.append}"
        )
    for n in (int(x) for x in args.n.split(",")):
        base = cur = None
        if args.only != "current":
            base = (
                run_child(ROOT, admin, n, args.rows, args.append, f"bench_cost_base_{n}")
                if args.compare_capture
                else run_child(base_tree, admin, n, args.rows, args.append, f"bench_cost_base_{n}")
            )
        if args.only != "baseline":
            cur = run_child(
                ROOT,
                admin,
                n,
                args.rows,
                args.append,
                f"bench_cost_cur_{n}",
                "after-commit" if args.compare_capture else args.capture,
            )
        if base and cur:
            report(n, base, cur)
        else:
            print(json.dumps({"n": n, "baseline": base, "current": cur}, indent=1))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
