"""`lakehouse ingest-bench run|purge`: the writer-flip runbook's concurrency bench (step 2)."""

from __future__ import annotations

import signal
import sys
import time

from lakehouse_dagster.cli.common import Result, add_command, table
from lakehouse_dagster.core.errors import BadInput


def register(sub) -> None:
    p = sub.add_parser(
        "ingest-bench",
        help="validate the write guards (G1–G4) at a target concurrency",
        description="validate the write guards (G1–G4) at a target concurrency",
    )
    actions = p.add_subparsers(dest="ingest_bench_action", required=True, metavar="ACTION")
    run = add_command(actions, "run", _run, help="a burst of concurrent iceberg-native writes into throwaway datasets")
    run.add_argument("--jobs", type=int, default=8, help="concurrent writer processes (default 8)")
    run.add_argument("--rows", type=int, default=100_000, help="rows per job (default 100000)")
    run.add_argument("--same-dataset", action="store_true", help="every job writes the same dataset (G3)")
    run.add_argument("--namespace", default="bench", help="Iceberg namespace of the bench tables (default bench)")
    run.add_argument(
        "--keep",
        action="store_true",
        help="keep the bench tables and datasets (default: purge them, also when interrupted)",
    )
    pg = add_command(actions, "purge", _purge, help="drop every bench table, dataset and workspace of a namespace")
    pg.add_argument("--namespace", default="bench")


def _run(ctx, args) -> Result:
    from lakehouse_dagster.api import ingest_bench  # here: the writers' machinery only when the verb runs

    # A SIGTERM (a supervisor, `kill`) interrupts like Ctrl-C: the bench's writers are stopped and, unless --keep,
    # what it made is purged before the command exits (130, "interrupted").
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        report = ingest_bench.run_ingest_bench(
            ctx.dsn,
            ctx.settings,
            jobs=args.jobs,
            rows=args.rows,
            same_dataset=args.same_dataset,
            namespace=args.namespace,
            actor=ctx.settings.project.actor,
        )
    except BaseException as exc:
        if not args.keep and not isinstance(exc, BadInput):  # bad input made nothing
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the purge short
            out = ingest_bench.purge(ctx.dsn, ctx.settings, namespace=args.namespace, actor=ctx.settings.project.actor)
            print(_purged_line(out), file=sys.stderr)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    data = report.as_dict()
    purge_seconds = {}
    if not args.keep:
        t = time.time()
        data["purged"] = ingest_bench.purge(
            ctx.dsn, ctx.settings, namespace=args.namespace, actor=ctx.settings.project.actor
        )
        purge_seconds = {"the purge": time.time() - t}
        data["phases"] = {**data["phases"], **purge_seconds}
        data["wall_seconds"] += purge_seconds["the purge"]
    rows = [{**o, "seconds": round(o["seconds"], 2)} for o in data["outcomes"]]
    lines = [table(rows, ["job", "status", "rows", "seconds", "snapshot_id", "error"])]
    lines += [f"table problem: {p}" for p in report.table_problems]
    # the summary's wall time covers the purge too: the command's whole time, not only the ingests'
    lines.append(report.summary_line(purge_seconds))
    lines.append(
        "gate: non-503 errors must be 0; 503s are healthy backpressure (raise "
        "LAKEHOUSE_MAX_CONCURRENT_INGEST or let callers retry)"
    )
    return Result(data, "\n".join(lines), exit_code=0 if report.passed else 1)


def _purge(ctx, args) -> Result:
    from lakehouse_dagster.api import ingest_bench  # here: the writers' machinery only when the verb runs

    out = ingest_bench.purge(ctx.dsn, ctx.settings, namespace=args.namespace, actor=ctx.settings.project.actor)
    return Result(out, _purged_line(out))


def _purged_line(out: dict) -> str:
    return (
        f"purged namespace {out['namespace']}: {out['tables_dropped']} table(s), {out['datasets']} dataset(s), "
        f"{out['workspaces']} workspace(s)"
    )


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
