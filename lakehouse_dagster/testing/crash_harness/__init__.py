"""The crash harness: a seeded random schedule of writes to a few datasets, syncs run as real CLI
processes killed (or interrupted, or failed) at random failpoints, and an oracle after every cycle.

One cycle: mutate one dataset in Postgres (appends, updates, deletes, a schema change, or nothing),
run `lakehouse sync --dataset <id> --json` with a random failpoint armed (or none), check what must hold
right away (the table never references a missing file; the poller requests the dataset whenever
Iceberg is behind), run one clean sync, then check the oracle:
  * the clean sync succeeds; the canary's verdict is ok (Iceberg equals Postgres: count and digest)
    and __row_index is unique in the table;
  * data files on disk == data files referenced by the table's snapshots (no snapshots are expired
    here, so nothing else may legitimately remain: no orphan of a killed or failed sync survives the
    next sync), and every file the current snapshot references exists;
  * iceberg_sync_log: no 'running' row; every succeeded row's snapshot exists in the table and its
    source_version <= the dataset's rows_version; the latest succeeded row covers rows_version;
  * datasets.row_count == rows in the table == rows in Postgres, status 'ready';
  * the poller (ingest/poller.pending_syncs) does not request the dataset (it is caught up).
A ``stop`` cycle freezes the sync at its failpoint instead, terminates its lock session, runs the clean
sync meanwhile, resumes the frozen one, and checks the oracle once both are done (a live process that
lost its guard locks must not commit over the other sync).
Given the infrastructure (``Infrastructure``: the Postgres server's restart and a TCP fault proxy the syncs
connect through), the schedule also breaks what is under the project (issue 32): ``pg-restart`` freezes the
sync at its failpoint, kills and restarts Postgres (``pg_ctl restart -m immediate``: every session ends, crash
recovery on start) and resumes it; ``reset`` cuts every connection of the frozen sync with a TCP RST;
``anytime:pg-restart`` restarts Postgres at a random moment of an unfrozen sync. The sync must then end with at
most one line on stderr and no traceback, and the oracle holds after the next clean sync as for every cycle.
A reverse cycle (``reverse_share``, issue 31) works on native datasets of its own (``make_native``): a native change
(an append, or a sync.full overwrite: a full reverse re-sync) lands in Iceberg through the write router, then
``apply_reverse`` runs in its own process killed or failed at reverse-after-copy, reverse-before-commit or
reverse-after-commit (or none): Postgres must hold a whole snapshot right after (the previous one unless the commit
happened), one clean apply must apply exactly when the killed one did not commit, and then dataset_rows is the
current snapshot with its identity, the position and the one reverse reconciliation name it, the counts are the
rows', and no echo (``reverse_cycle`` says it all). Given the infrastructure, reverse cycles take its faults too:
``lakehouse reverse sync`` frozen at its failpoint while Postgres restarts or its connections are reset,
or Postgres restarted at any moment of it; it must end in one line with an exit the guide names. Given an object
store, reverse cycles take its faults for the whole apply: down (nothing read, so nothing written: the previous
snapshot stays) or answering 503 to a third of requests (either snapshot whole).
Used by lakehouse_dagster_tests/test_crash_harness.py (short, CI) and bench/bench_crash.py (>= 200 cycles).
"""

from __future__ import annotations

import functools
import random
import time

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.testing.crash_harness.oracle import (  # noqa: F401 - the package's face
    Oracle,
)
from lakehouse_dagster.testing.crash_harness.processes import (  # noqa: F401 - the package's face
    _SYNC_ENV,
    _clean_sync,
    _frozen_cycle,
    _infra_cycle,
    _infra_outcome,
    _reconnect,
    _reverse_actions,
    _run_script,
    _sync_popen,
)
from lakehouse_dagster.testing.crash_harness.reverse import (  # noqa: F401 - the package's face
    make_native,
    native_change,
    reverse_cycle,
)
from lakehouse_dagster.testing.crash_harness.schedule import (  # noqa: F401 - the package's face
    _LIBPQ_GOODBYE,
    ACTIONS,
    INFRA_ACTIONS,
    POINTS,
    REVERSE_ACTIONS,
    REVERSE_ONCE,
    REVERSE_POINTS,
    STORE_ACTIONS,
    STREAM_ACTIONS,
    STREAM_ONCE,
    Infrastructure,
    Report,
    _row,
    mutate,
)
from lakehouse_dagster.testing.faults import cli_env, cli_sync_popen
from lakehouse_dagster.tracking import datasets as app_tables


def run_cycles(  # noqa: C901
    dsn: str,
    settings,
    *,
    seed: int,
    cycles: int,
    datasets: int = 2,
    progress=None,
    actions=None,
    armed_share: float = 0.85,
    infra: Infrastructure | None = None,
    stream_share: float = 0.0,
    reverse_share: float = 0.0,
) -> Report:
    """Long on purpose: one cycle's schedule, fault and checks read in order here. ``actions``: [(action,
    weight)] to draw from (default ACTIONS, and INFRA_ACTIONS when ``infra`` is given). ``stream_share``: the
    share of cycles whose process is a mirror stream instead of ``lakehouse sync`` (armed from STREAM_ACTIONS).
    ``reverse_share``: the share of cycles that are reverse cycles (``reverse_cycle``) of native datasets of their
    own, drawn from a generator of their own (an old seed's forward schedule stays the same), armed from
    REVERSE_ACTIONS and, given ``infra``, INFRA_ACTIONS (of ``actions`` when given: those a reverse cycle takes)."""
    # The oracle counts every data file no snapshot references as an orphan and every succeeded sync's snapshot as
    # present: no snapshot may expire here, here and in the killed processes (a run past an hour met the
    # commit-time expiry of snapshots older than LAKEHOUSE_SNAPSHOTS_MAX_AGE_SECONDS, and its oracle cried wolf).
    settings = settings.replace(sync={"snapshots_keep": 0})
    reverse_actions = _reverse_actions(actions, infra)
    if not actions:
        actions = ACTIONS + INFRA_ACTIONS if infra else ACTIONS
        if infra and infra.store is not None:
            actions = actions + STORE_ACTIONS
    rng = random.Random(seed)
    report = Report(seed)
    started = time.perf_counter()
    oracle = Oracle(dsn, settings)
    sync_dsn = infra.proxy.dsn(dsn) if infra else dsn  # the killed syncs' sessions go through the proxy
    conn = connect(dsn)
    try:
        ws = app_tables.create_workspace(conn, f"crash-{seed}")
        ids = []
        for i in range(datasets):
            schema = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]
            d = app_tables.create_dataset(conn, ws, f"crash-{i}", schema)
            app_tables.insert_rows(conn, d, [_row(rng, schema) for _ in range(rng.randint(0, 300))])
            ids.append(d)
        rrng = random.Random(f"reverse-{seed}")
        native = {}  # native dataset -> the next row_index a native append writes
        if reverse_share > 0:
            for i in range(max(1, datasets // 2)):
                d, native[d] = make_native(conn, dsn, oracle.catalog, settings, ws, f"native-{i}", rrng)
        for cycle in range(cycles):
            if native and rrng.random() < reverse_share:
                d = rrng.choice(sorted(native))
                spec, rc, conn = reverse_cycle(
                    conn, dsn, oracle, settings, d, native, rrng, report, cycle, armed_share, reverse_actions, infra
                )
                report.cycles += 1
                if progress:
                    progress(cycle, spec, rc, report)
                continue
            d = rng.choice(ids)
            mutate(conn, rng, d, report)
            spec = None
            if rng.random() < armed_share:
                point = rng.choice(POINTS)
                action = rng.choices([a for a, _ in actions], weights=[w for _, w in actions])[0]
                spec = "anytime:pg-restart" if action == "anytime-pg-restart" else f"{point}:{action}"
                report.armed[spec] += 1
            chunk = rng.choice([40, 150, 100000])
            clean_settings = settings.replace(sync={"chunk_rows": rng.choice([60, 100000])})
            # drawn only when asked for: an old seed keeps its schedule
            streamed = stream_share > 0 and rng.random() < stream_share
            if streamed and spec is not None:
                report.armed[spec] -= 1
                if not report.armed[spec]:
                    del report.armed[spec]
                point = spec.split(":")[0] if not spec.startswith("anytime") else rng.choice(POINTS)
                action = rng.choices([a for a, _ in STREAM_ACTIONS], weights=[w for _, w in STREAM_ACTIONS])[0]
                spec = f"stream/{point}:{action}"
                report.armed[spec] += 1
            where = f"cycle {cycle} (dataset {d}, failpoint {spec})"
            if streamed:
                env = cli_env(
                    spec.split("/", 1)[1] if spec else None,
                    LAKEHOUSE_INGEST_CHUNK_ROWS=str(chunk),
                    LAKEHOUSE_SNAPSHOTS_KEEP="0",
                )
                env["LAKEHOUSE_PG_DSN"] = sync_dsn
                rc, stderr = _run_script(STREAM_ONCE, f"crash-stream-{seed}-{cycle}", env, report, "stream")
                where = f"cycle {cycle} (dataset {d}, stream, failpoint {spec}, exit {rc})"
                if spec and (rc in (-9, -15) or "failpoint" in stderr):
                    report.fired[spec] += 1
                elif rc != 0:
                    report.violations.append(
                        f"{where}: a stream without a fired failpoint exited {rc}: {stderr[-300:]}"
                    )
                report.violations += [f"{where}: {v}" for v in oracle.before_clean_sync(conn, d)]
                clean_error = _clean_sync(dsn, oracle, clean_settings, d)
            elif spec and spec.endswith(":stop"):
                rc, clean_error = _frozen_cycle(conn, dsn, oracle, clean_settings, d, spec, chunk, report)
                where = f"cycle {cycle} (dataset {d}, failpoint {spec}, exit {rc})"
                if rc not in (0, 1, 4, 75):  # 75: its lock session died, "not committing" (try again)
                    report.violations.append(f"{where}: the resumed sync exited {rc}")
            else:
                env = cli_env(
                    None,
                    LAKEHOUSE_INGEST_CHUNK_ROWS=str(chunk),
                    LAKEHOUSE_PG_DSN=sync_dsn,
                    LAKEHOUSE_SNAPSHOTS_KEEP="0",
                )
                if infra and spec and spec.split(":")[1] in ("pg-restart", "reset", "store-down", "store-flaky"):
                    rc, stderr, fired = _infra_cycle(infra, spec, functools.partial(_sync_popen, d), env, rng)
                    conn = _reconnect(conn, dsn)
                    report.outcomes[rc] += 1
                    where = f"cycle {cycle} (dataset {d}, failpoint {spec}, exit {rc})"
                    if fired:
                        report.fired[spec] += 1
                    report.violations += [f"{where}: {v}" for v in _infra_outcome(rc, stderr, fired)]
                else:
                    proc = cli_sync_popen(d, env=cli_env(spec, **{k: env[k] for k in _SYNC_ENV}))
                    _, stderr = proc.communicate(timeout=120)
                    rc = proc.returncode
                    report.outcomes[rc] += 1
                    where = f"cycle {cycle} (dataset {d}, failpoint {spec}, exit {rc})"
                    if spec and (rc in (-9, 130) or "failpoint" in stderr):
                        report.fired[spec] += 1
                    elif rc != 0:
                        report.violations.append(
                            f"cycle {cycle}: sync without a fired failpoint exited {rc}: {stderr.strip()[-300:]}"
                        )
                report.violations += [f"{where}: {v}" for v in oracle.before_clean_sync(conn, d)]
                clean_error = _clean_sync(dsn, oracle, clean_settings, d)
            if clean_error:
                report.violations.append(f"{where}: the clean sync failed: {clean_error}")
            else:
                report.violations += [f"{where}: {v}" for v in oracle.after_clean_sync(conn, d)]
            report.cycles += 1
            if progress:
                progress(cycle, spec, rc, report)
    finally:
        conn.close()
    report.seconds = time.perf_counter() - started
    return report
