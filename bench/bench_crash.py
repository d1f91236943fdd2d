"""Crash harness, long run: >= 1,000 seeded cycles of writes + syncs killed at random failpoints, with Postgres
killed and restarted and connections reset under them.

`nice .venv/bin/python bench/bench_crash.py --cycles 1000 --seed 7` prints the cycles, the failpoints
armed and fired (kills per failpoint, infrastructure faults by kind), the sync exit codes, the write mix, the
violations (must be 0) and the seed, then one JSON line. It runs its own embedded Postgres (restarted by the
schedule) behind a TCP fault proxy; `--no-infra` leaves the infrastructure alone (the failpoints only) and uses
LAKEHOUSE_PG_DSN when set. `--reverse-share 1` makes every cycle a reverse cycle (issue 31: a native change, the
reverse apply killed before, inside or after its commit; `--reverse-share 1 --cycles 200 --no-infra`); with the
infrastructure, reverse cycles take its faults too (the operator's `lakehouse reverse sync` frozen at its failpoint
while Postgres restarts or its connections are reset, or Postgres restarted at any moment of it), and `--infra-only`
arms every cycle from the infrastructure's faults alone (`--reverse-share 1 --infra-only --cycles 200`). `--catalog rest`
puts the tables in an Iceberg REST catalog (SeaweedFS's `weed mini`, started here as the tests start it; warehouse on
its S3): `--catalog rest --stream-share 1` and `--catalog rest --reverse-share 1` run those modes on REST. With
`--store` the warehouse is on an object store behind a fault proxy and reverse cycles also draw its faults: down, or
503s to a third of requests, for the whole apply (`--reverse-share 1 --store --infra-only --cycles 60`).
What each cycle checks: lakehouse_dagster/testing/crash_harness/.
Not a timing benchmark: seconds are printed for planning only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import admin_dsn, fresh_database  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=200)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--datasets", type=int, default=4)
    p.add_argument("--no-infra", action="store_true", help="failpoints only: Postgres and the network left alone")
    p.add_argument(
        "--stream-share", type=float, default=0.0, help="share of cycles whose killed process is a mirror stream"
    )
    p.add_argument(
        "--reverse-share",
        type=float,
        default=0.0,
        help="share of cycles that are reverse cycles: a native change, then a reverse apply killed at its failpoint",
    )
    p.add_argument(
        "--infra-only",
        action="store_true",
        help="arm cycles from the infrastructure's faults alone (Postgres restarts, resets), not the failpoints' own",
    )
    p.add_argument(
        "--store",
        action="store_true",
        help="the warehouse on an object store (moto_server) behind a fault proxy: adds its 503s to the faults",
    )
    p.add_argument(
        "--catalog",
        choices=["sql", "rest"],
        default="sql",
        help="rest: the tables in an Iceberg REST catalog, warehouse on its S3 (SeaweedFS `weed mini`, started here)",
    )
    a = p.parse_args()
    if a.store and a.catalog == "rest":
        p.error("--store puts the warehouse on moto behind a fault proxy: not with --catalog rest (SeaweedFS's S3)")
    if a.store and a.no_infra:
        p.error("--store is an infrastructure fault: not with --no-infra")
    if a.infra_only and a.no_infra:
        p.error("--infra-only arms the infrastructure's faults: not with --no-infra")

    home = Path(tempfile.mkdtemp(prefix="lh-crash-"))
    if a.no_infra:
        admin = admin_dsn()
    else:  # a server of its own: the schedule restarts it
        from lakehouse_dagster.core.embedded import start_embedded

        admin = start_embedded(home / "pg", keep_running=False, delete_on_exit=True)
    dsn = fresh_database(admin, "bench_crash")
    (home / "warehouse").mkdir()
    os.environ.update(
        {  # the killed syncs are CLI processes: they read the same configuration
            "LAKEHOUSE_PG_DSN": dsn,
            "LAKEHOUSE_HOME": str(home / "home"),
            "LAKEHOUSE_WAREHOUSE": (home / "warehouse").as_uri(),
            "LAKEHOUSE_NAMESPACE": "lakehouse",
        }
    )
    if a.reverse_share > 0:  # the native datasets are read-flipped just before their writers: no soak to wait out
        os.environ.setdefault("LAKEHOUSE_SOAK_SECONDS", "0")
    weed = None
    if (
        a.catalog == "rest"
    ):  # started as the tests start it (lakehouse_dagster/testing/seaweed.py): its env is the CLI's
        from lakehouse_dagster.testing.seaweed import SeaweedServer

        weed = SeaweedServer()
        os.environ.update({**weed.env, "LAKEHOUSE_NAMESPACE": f"crash_{a.seed}"})
    moto = store = None
    if a.store:
        from lakehouse_dagster.testing.http_fault_proxy import S3FaultProxy
        from lakehouse_dagster.testing.s3 import AWS_ENV, MotoServer

        moto = MotoServer()
        moto.client.create_bucket(Bucket="crash")
        store = S3FaultProxy(moto.endpoint)
        os.environ.update(
            {**AWS_ENV, "LAKEHOUSE_WAREHOUSE": "s3://crash/warehouse", "LAKEHOUSE_S3_ENDPOINT": store.endpoint}
        )
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.testing.crash_harness import INFRA_ACTIONS, STORE_ACTIONS, Infrastructure, run_cycles
    from lakehouse_dagster.testing.service import restart_postgres
    from lakehouse_dagster.testing.tcp_proxy import TcpProxy

    shown = [0]

    def progress(cycle, spec, rc, report):
        for v in report.violations[shown[0] :]:
            print(f"  VIOLATION {v}", flush=True)
        shown[0] = len(report.violations)
        if (cycle + 1) % 10 == 0:
            print(
                f"  cycle {cycle + 1}: {sum(report.fired.values())} failpoints fired, "
                f"{len(report.violations)} violations",
                flush=True,
            )

    proxy = None if a.no_infra else TcpProxy.for_dsn(dsn)
    infra = None if proxy is None else Infrastructure(lambda: restart_postgres(home / "pg"), proxy, store)
    try:
        report = run_cycles(
            dsn,
            Settings.from_env(),
            seed=a.seed,
            cycles=a.cycles,
            datasets=a.datasets,
            progress=progress,
            infra=infra,
            stream_share=a.stream_share,
            reverse_share=a.reverse_share,
            actions=(INFRA_ACTIONS + (STORE_ACTIONS if store else [])) if a.infra_only else None,
        )
    finally:
        if proxy is not None:
            proxy.close()
        if store is not None and moto is not None:
            store.close()
            moto.close()
        if weed is not None:
            weed.close()
    print(
        f"seed {report.seed}  cycles {report.cycles}  datasets {a.datasets}  catalog {a.catalog}  {report.seconds:.0f}s"
    )
    print(f"kills per failpoint: {json.dumps(report.kills_per_failpoint(), sort_keys=True)}")
    print(f"faults by kind: {json.dumps(report.faults_by_kind(), sort_keys=True)}")
    print(f"fired (point:action): {json.dumps(dict(sorted(report.fired.items())))}")
    print(f"sync exit codes: {json.dumps({str(k): v for k, v in sorted(report.outcomes.items())})}")
    print(f"writes: {json.dumps(dict(report.ops), sort_keys=True)}")
    print(f"violations: {len(report.violations)}")
    for v in report.violations:
        print(f"  {v}")
    print(json.dumps(report.as_dict(), default=str))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
