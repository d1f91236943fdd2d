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
Used by lakehouse_dagster_tests/test_crash_harness.py (short, CI) and bench/bench_crash.py (>= 200 cycles).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.mirror.poller import Cursor, pending_syncs
from lakehouse_dagster.mirror.reaper import files_by_sync
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity import canary
from lakehouse_dagster.parity.digest import IcebergSide, pin_iceberg
from lakehouse_dagster.testing.faults import (
    cli_env,
    cli_sync_popen,
    data_files_on_disk,
    terminate_lock_session,
    wait_stopped,
)
from lakehouse_dagster.testing.http_fault_proxy import S3FaultProxy
from lakehouse_dagster.testing.tcp_proxy import TcpProxy
from lakehouse_dagster.tracking import datasets as app_tables
from lakehouse_dagster.tracking.datasets import parse_schema

POINTS = ["after-first-file", "before-commit", "commit-start", "in-commit", "after-commit-before-log", "after-log"]
# stop: the sync freezes at the failpoint, its lock session is terminated, the clean sync runs meanwhile,
# then the frozen one resumes (a live process whose guard locks died: it must not commit over the other)
ACTIONS = [("kill", 64), ("raise", 8), ("oserror", 7), ("sigint", 10), ("sigterm", 5), ("stop", 6)]
# with the infrastructure given: Postgres killed and restarted at a failpoint or at any moment; connections reset
INFRA_ACTIONS = [("pg-restart", 12), ("reset", 10), ("anytime-pg-restart", 10)]
# with an object store given (the warehouse on s3:// through an S3FaultProxy): it answers 503 to everything from the
# failpoint on (the SDK's retries run out: the sync fails), or 503 to a third of all requests for the whole sync
STORE_ACTIONS = [("store-down", 10), ("store-flaky", 8)]
# a stream cycle's process is a mirror stream (mirror/stream.py), killed or failed at the failpoint inside its sync
STREAM_ACTIONS = [("kill", 70), ("raise", 10), ("oserror", 10), ("sigterm", 10)]
TYPES = ["string", "int64", "float64", "boolean", "json"]
# A stream of shard 0 of 1 as a stream run runs it, until it is first idle with nothing due (its first sweep
# found what the cycle changed and synced it) or killed at its failpoint; each failed sync printed on stderr.
STREAM_ONCE = """
import sys, time
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.batch import Failed
from lakehouse_dagster.mirror.stream import Idle, stream_shard
s = Settings.from_env()
for e in stream_shard(s.pg_dsn, load_catalog(s, s.pg_dsn), s, shard=0, shard_count=1, run_id=sys.argv[1],
                      deadline=time.time() + 90):
    if isinstance(e, Failed):
        print(f"failed: {e.error}", file=sys.stderr)
    if isinstance(e, Idle) and e.backlog == 0:
        break
"""
# libpq (under ADBC's readers) prints the server's goodbye straight to stderr, and Arrow's C++ S3 filesystem its own
# retries (`s3fs.cc:817: CompletedMultipartUpload got error embedded in a 200 OK response: SlowDown …, retry = 1`),
# both outside the project's reach (docs/design/faults.md): not counted as lines of the project's
_LIBPQ_GOODBYE = "WARNING:  terminating connection due to immediate shutdown command"
_ARROW_S3_LOG = re.compile(r"^/\S*/arrow/filesystem/s3fs\.cc:\d+: ")


@dataclasses.dataclass
class Infrastructure:
    """What the harness may break beyond the project's own processes: ``restart`` kills and restarts the
    Postgres server; ``proxy`` forwards the killed syncs' sessions to it (and resets them)."""

    restart: Callable[[], None]
    proxy: TcpProxy
    store: S3FaultProxy | None = None  # in front of the warehouse's object store, when it is on one


@dataclasses.dataclass
class Report:
    seed: int
    cycles: int = 0
    armed: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # "point:action" → cycles
    fired: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # "point:action" → took effect
    outcomes: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # exit codes
    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    violations: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def kills_per_failpoint(self) -> dict[str, int]:
        out: dict[str, int] = collections.Counter()
        for key, n in self.fired.items():
            point, action = key.split(":")
            if action == "kill":  # a stream cycle's point is "stream/<point>"
                out[point] += n
        return dict(out)

    def faults_by_kind(self) -> dict[str, int]:
        """Fired faults by action (kill, sigint, ..., pg-restart, reset), whatever the failpoint."""
        out: dict[str, int] = collections.Counter()
        for key, n in self.fired.items():
            out[key.split(":")[1]] += n
        return dict(out)

    def as_dict(self) -> dict:
        return {
            "seed": self.seed,
            "cycles": self.cycles,
            "seconds": round(self.seconds, 1),
            "kills_per_failpoint": self.kills_per_failpoint(),
            "faults_by_kind": self.faults_by_kind(),
            "fired": dict(self.fired),
            "armed": dict(self.armed),
            "exit_codes": dict(self.outcomes),
            "ops": dict(self.ops),
            "violations": self.violations,
        }


def _value(rng: random.Random, type_: str):
    if rng.random() < 0.1:
        return None
    return {
        "string": lambda: rng.choice(["", "a", "ünï ✓", "x" * rng.randint(1, 40)]),
        "int64": lambda: rng.randint(-(2**62), 2**62),
        "float64": lambda: rng.choice([rng.uniform(-1e6, 1e6), 0.0, "NaN", "Infinity", 1e-300]),
        "boolean": lambda: rng.random() < 0.5,
        "json": lambda: rng.choice([{"k": rng.randint(0, 9)}, [1, "two", None], "s", 3.5, {}]),
    }[type_]()


def _row(rng, columns) -> dict:
    return {c["name"]: _value(rng, c["type"]) for c in columns if rng.random() < 0.95}


def mutate(conn, rng: random.Random, d: uuid.UUID, report: Report) -> None:
    """1–3 random writes to the dataset: appends, updates, deletes, a schema change, or nothing."""
    columns = conn.execute("select schema from datasets where id = %s", (d,)).fetchone()[0]
    for _ in range(rng.randint(1, 3)):
        op = rng.choices(["append", "update", "delete", "schema", "none"], weights=[45, 20, 15, 8, 12])[0]
        report.ops[op] += 1
        if op == "append":
            app_tables.insert_rows(conn, d, [_row(rng, columns) for _ in range(rng.randint(1, 400))])
        elif op == "update":
            col = rng.choice(columns)
            value = json.dumps({col["name"]: _value(rng, col["type"])})
            conn.execute(
                "update dataset_rows set data = data || %s::jsonb where dataset_id = %s and row_index %% %s = %s",
                (value, d, rng.randint(2, 20), rng.randint(0, 1)),
            )
        elif op == "delete":
            conn.execute(
                "delete from dataset_rows where dataset_id = %s and row_index %% %s = %s",
                (d, rng.randint(5, 40), rng.randint(0, 4)),
            )
        elif op == "schema" and len(columns) < 8:
            new = {"name": f"c{len(columns)}_{rng.randint(0, 999)}", "type": rng.choice(TYPES)}
            columns = columns + [new]
            app_tables.set_schema(conn, d, columns)
            value = json.dumps({new["name"]: _value(rng, new["type"])})
            conn.execute(
                "update dataset_rows set data = data || %s::jsonb where dataset_id = %s and row_index %% 3 = 0",
                (value, d),
            )


class Oracle:
    """The checks, with a cache of each snapshot's data files (snapshots never change)."""

    def __init__(self, dsn: str, settings):
        self.dsn, self.settings = dsn, settings
        self.catalog = load_catalog(settings, dsn)
        self._files: dict[int, set[str]] = {}

    def _snapshot_files(self, table, snapshot_id: int) -> set[str]:
        if snapshot_id not in self._files:
            self._files[snapshot_id] = {
                t.file.file_path.rsplit("/", 1)[-1] for t in table.scan(snapshot_id=snapshot_id).plan_files()
            }
        return self._files[snapshot_id]

    def table(self, d):
        return load_table_or_none(self.catalog, table_identifier(self.settings, d))

    def before_clean_sync(self, conn, d) -> list[str]:
        bad = []
        table = self.table(d)
        snap = table.current_snapshot() if table is not None else None
        if snap is not None:
            missing = self._snapshot_files(table, snap.snapshot_id) - data_files_on_disk(table)
            if missing:
                bad.append(f"the current snapshot references missing files {sorted(missing)[:3]}")
        version = conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
        pin = pin_iceberg(self.catalog, self.settings, d)
        behind = pin.source_version is None or pin.source_version < version
        requested = d in {p.dataset_id for p in pending_syncs(conn, Cursor(), limit=1000)[0]}
        if behind and not requested:
            bad.append(
                f"Iceberg is behind (covers {pin.source_version}, Postgres at {version}) but the poller "
                "does not request the dataset"
            )
        return bad

    def after_clean_sync(self, conn, d) -> list[str]:
        bad = []
        table = self.table(d)
        if table is None or table.current_snapshot() is None:
            return ["no table or no snapshot after a clean sync"]
        on_disk = data_files_on_disk(table)
        current = self._snapshot_files(table, table.current_snapshot().snapshot_id)
        referenced = set().union(*(self._snapshot_files(table, s.snapshot_id) for s in table.snapshots()))
        if current - on_disk:
            bad.append(f"the current snapshot references missing files {sorted(current - on_disk)[:3]}")
        if on_disk - referenced:
            orphans = sorted(on_disk - referenced)
            bad.append(f"{len(orphans)} orphan data files after the next sync, e.g. {orphans[:2]}")
        named = {p.rsplit("/", 1)[-1] for paths in files_by_sync(table).values() for p in paths}
        unnamed = on_disk - named
        if unnamed:
            bad.append(f"data files not named after a sync: {sorted(unnamed)[:2]}")

        v = canary.evaluate(self.dsn, self.catalog, self.settings, d, localise=False)
        if v.verdict != canary.OK:
            bad.append(
                f"canary {v.verdict}: {v.detail.get('reason')} (pg {v.pg_count}/{v.pg_digest}, "
                f"iceberg {v.iceberg_count}/{v.iceberg_digest})"
            )
        pin = pin_iceberg(self.catalog, self.settings, d)
        columns = parse_schema(conn.execute("select schema from datasets where id = %s", (d,)).fetchone()[0])
        with IcebergSide(pin, columns, threads=1) as side:
            stats = side.identity_stats()
        if stats["rows"] != stats["distinct_row_index"]:
            bad.append(f"__row_index not unique: {stats['rows']} rows, {stats['distinct_row_index']} distinct")

        version, row_count, status = conn.execute(
            "select rows_version, row_count, status from datasets where id = %s", (d,)
        ).fetchone()
        pg_rows = conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0]
        if not (row_count == stats["rows"] == pg_rows):
            bad.append(
                f"row counts differ: datasets.row_count {row_count}, Iceberg {stats['rows']}, Postgres {pg_rows}"
            )
        if status != "ready":
            bad.append(f"dataset status {status!r} after a clean sync")
        log = conn.execute(
            "select sync_id, status, source_version, snapshot_id from iceberg_sync_log"
            " where dataset_id = %s order by finished_at",
            (d,),
        ).fetchall()
        snapshot_ids = {s.snapshot_id for s in table.snapshots()}
        for sid, st, sv, snap_id in log:
            if st == "running":
                bad.append(f"sync {sid} still 'running' after the next sync")
            if st == "succeeded":
                if snap_id not in snapshot_ids:
                    bad.append(f"succeeded sync {sid} names snapshot {snap_id}, not in the table")
                if sv is None or sv > version:
                    bad.append(f"succeeded sync {sid} covers version {sv}, Postgres is at {version}")
        latest = [r for r in log if r[1] == "succeeded"]
        if not latest or latest[-1][2] != version:
            bad.append(
                f"the latest succeeded sync covers {latest[-1][2] if latest else None}, Postgres is at {version}"
            )
        if d in {p.dataset_id for p in pending_syncs(conn, Cursor(), limit=1000)[0]}:
            bad.append("the poller still requests a caught-up dataset")
        return bad


def run_cycles(
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
) -> Report:
    """Long on purpose: one cycle's schedule, fault and checks read in order here. ``actions``: [(action,
    weight)] to draw from (default ACTIONS, and INFRA_ACTIONS when ``infra`` is given). ``stream_share``: the
    share of cycles whose process is a mirror stream instead of ``lakehouse sync`` (armed from STREAM_ACTIONS)."""
    # The oracle counts every data file no snapshot references as an orphan and every succeeded sync's snapshot as
    # present: no snapshot may expire here, here and in the killed processes (a run past an hour met the
    # commit-time expiry of snapshots older than LAKEHOUSE_SNAPSHOTS_MAX_AGE_SECONDS, and its oracle cried wolf).
    settings = settings.replace(snapshots_keep=0)
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
        for cycle in range(cycles):
            d = rng.choice(ids)
            mutate(conn, rng, d, report)
            spec = None
            if rng.random() < armed_share:
                point = rng.choice(POINTS)
                action = rng.choices([a for a, _ in actions], weights=[w for _, w in actions])[0]
                spec = "anytime:pg-restart" if action == "anytime-pg-restart" else f"{point}:{action}"
                report.armed[spec] += 1
            chunk = rng.choice([40, 150, 100000])
            clean_settings = settings.replace(ingest_chunk_rows=rng.choice([60, 100000]))
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
                proc = subprocess.Popen(
                    [sys.executable, "-c", STREAM_ONCE, f"crash-stream-{seed}-{cycle}"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
                _, stderr = proc.communicate(timeout=180)
                rc = proc.returncode
                report.outcomes[rc] += 1
                report.ops["stream"] += 1
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
                    rc, stderr, fired = _infra_cycle(infra, spec, d, env, rng)
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


_SYNC_ENV = ("LAKEHOUSE_INGEST_CHUNK_ROWS", "LAKEHOUSE_PG_DSN", "LAKEHOUSE_SNAPSHOTS_KEEP")


def _infra_cycle(infra: Infrastructure, spec: str, d, env: dict, rng: random.Random) -> tuple[int, str, bool]:
    """One sync and one infrastructure fault: at its failpoint (frozen there, broken, resumed) or, for
    ``anytime:``, at a random moment while it runs. Returns its exit code, its stderr and whether the fault hit
    it (it had not ended yet)."""
    point, action = spec.split(":")
    if action == "store-flaky":
        assert infra.store is not None
        infra.store.fail(503, share=0.33, seed=rng.randrange(1 << 30))
        proc = cli_sync_popen(d, env=env)
        try:
            _, stderr = proc.communicate(timeout=300)
        finally:
            infra.store.pass_through()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, stderr, True
    if point == "anytime":
        proc = cli_sync_popen(d, env=env)
        time.sleep(rng.uniform(0.3, 3.5))  # start-up is ~1.5-3 s of imports: some land before, most during
        fired = proc.poll() is None
        if fired:
            infra.restart()
    else:
        proc = cli_sync_popen(d, env=cli_env(f"{point}:stop", **{k: env[k] for k in _SYNC_ENV}))
        fired = wait_stopped(proc, 120, must=False)
        if fired:
            if action == "pg-restart":
                infra.restart()
            elif action == "store-down":
                assert infra.store is not None
                infra.store.fail(503)
            else:
                infra.proxy.reset()
            os.kill(proc.pid, signal.SIGCONT)
    try:
        _, stderr = proc.communicate(timeout=300)
    finally:
        if infra.store is not None:
            infra.store.pass_through()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stderr, fired


def _infra_outcome(rc: int, stderr: str, fired: bool) -> list[str]:
    """What the operator reads after an infrastructure fault: an exit the guide names and one line."""
    bad = []
    if rc not in (0, 1, 4, 75):
        bad.append(f"the sync exited {rc} after an infrastructure fault")
    if "Traceback" in stderr:
        bad.append(f"a traceback on stderr: {stderr.strip()[-400:]}")
    lines = [
        ln for ln in stderr.strip().splitlines() if ln.strip() and ln != _LIBPQ_GOODBYE and not _ARROW_S3_LOG.match(ln)
    ]
    if len(lines) > 1:
        bad.append(f"{len(lines)} lines on stderr, not one: {lines[:3]}")
    if not fired and rc != 0:
        bad.append(f"the sync ended before the fault yet exited {rc}: {stderr.strip()[-300:]}")
    return bad


def _reconnect(conn, dsn: str, timeout: float = 60):
    """The harness's own session, again once Postgres is back (a restart ended it)."""
    try:
        conn.execute("select 1")
        return conn
    except Exception:  # noqa: BLE001 - ended by the restart: open another below
        conn.close()
    deadline = time.monotonic() + timeout
    while True:
        try:
            return connect(dsn, connect_timeout=2)
        except Exception:  # noqa: BLE001 - still in crash recovery
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _clean_sync(dsn, oracle, settings, d) -> str | None:
    try:
        sync_dataset(dsn, oracle.catalog, settings, d, readers=1)
    except Exception as exc:  # noqa: BLE001 - a violation, reported with the cycle
        return f"{type(exc).__name__}: {exc}"
    return None


def _frozen_cycle(conn, dsn, oracle, settings, d, spec, chunk, report) -> tuple[int, str | None]:
    """The sync freezes at its failpoint; its lock session dies; the clean sync runs; the frozen one
    resumes and finishes (or fails) on its own. The oracle then runs with both done."""
    proc = cli_sync_popen(d, env=cli_env(spec, LAKEHOUSE_INGEST_CHUNK_ROWS=str(chunk), LAKEHOUSE_SNAPSHOTS_KEEP="0"))
    clean_error = None
    try:
        if wait_stopped(proc, 120, must=False):
            report.fired[spec] += 1
            terminate_lock_session(conn, d)
            clean_error = _clean_sync(dsn, oracle, settings, d)
            os.kill(proc.pid, signal.SIGCONT)
            proc.communicate(timeout=120)
        else:
            proc.communicate(timeout=120)
            clean_error = _clean_sync(dsn, oracle, settings, d)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
    report.outcomes[proc.returncode] += 1
    return proc.returncode, clean_error
