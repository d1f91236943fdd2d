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
``lakehouse write-flags reverse sync`` frozen at its failpoint while Postgres restarts or its connections are reset,
or Postgres restarted at any moment of it; it must end in one line with an exit the guide names. Given an object
store, reverse cycles take its faults for the whole apply: down (nothing read, so nothing written: the previous
snapshot stays) or answering 503 to a third of requests (either snapshot whole).
Used by lakehouse_dagster_tests/test_crash_harness.py (short, CI) and bench/bench_crash.py (>= 200 cycles).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import functools
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

import pyarrow as pa

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.flags import registry
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.lake.writer import MAX_ROW_INDEX, SYNC_FILE, TableWrite
from lakehouse_dagster.mirror.poller import Cursor, pending_syncs
from lakehouse_dagster.mirror.reaper import files_by_sync
from lakehouse_dagster.mirror.reverse import apply_reverse, position
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity import canary
from lakehouse_dagster.parity.digest import IcebergSide, pin_iceberg
from lakehouse_dagster.routing.native_table import write_native_table
from lakehouse_dagster.routing.write_router import route_write
from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back
from lakehouse_dagster.runbooks.reverse_parity import reverse_parity
from lakehouse_dagster.status.recording import STREAMS, Position, read_stream
from lakehouse_dagster.testing.faults import (
    cli_env,
    cli_popen,
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
STORE = {a for a, _ in STORE_ACTIONS}
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
# A reverse cycle's process: one reverse apply of the dataset (mirror/reverse.py), as the stream or a
# reverse_mirror_job run does it, killed or failed at its failpoint.
REVERSE_ONCE = """
import sys
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.reverse import apply_reverse
s = Settings.from_env()
print(apply_reverse(s.pg_dsn, load_catalog(s, s.pg_dsn), s, sys.argv[1]).how)
"""
# before the copy's transaction commits (after the rows are copied: append or full; with everything written) or
# after it, the dataset lock still held
REVERSE_POINTS = ["reverse-after-copy", "reverse-before-commit", "reverse-after-commit"]
REVERSE_ACTIONS = [("kill", 70), ("raise", 10), ("oserror", 10), ("sigterm", 10)]
# a native dataset's writers: sync.append appends, sync.full overwrites the table (a full reverse re-sync)
NATIVE_WRITERS = [("sync.append", 70), ("sync.full", 30)]
NATIVE_SCHEMA = [
    {"name": "n", "type": "int64"},
    {"name": "s", "type": "string"},
    {"name": "x", "type": "float64"},
    {"name": "b", "type": "boolean"},
    {"name": "j", "type": "json"},
]
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

    @staticmethod
    def _orphans_syncs(conn, names: list[str]) -> list[tuple]:
        """What the sync log says of the syncs the orphan files are named after (a violation's first clue: a plain
        `failed` row is never settled by the reaper, an `unsettled:` or `running` one should have been)."""
        ids = sorted({m.group(1) for m in map(SYNC_FILE.match, names) if m})
        rows = conn.execute(
            "select sync_id::text, status, left(coalesce(error, ''), 160) from iceberg_sync_log"
            " where sync_id::text = any(%s)",
            (ids,),
        ).fetchall()
        return [tuple(r) for r in rows] + [(sid, "no log row", "") for sid in ids if sid not in {r[0] for r in rows}]

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

    def after_clean_sync(self, conn, d) -> list[str]:  # noqa: C901 - one check per invariant after a clean sync, each with its message
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
            bad.append(
                f"{len(orphans)} orphan data files after the next sync, e.g. {orphans[:2]}; "
                f"their syncs' log rows: {self._orphans_syncs(conn, orphans)}"
            )
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


def run_cycles(  # noqa: C901 - the crash harness's cycle loop: each action and its check share the cycle's state
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
    settings = settings.replace(snapshots_keep=0)
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


_SYNC_ENV = ("LAKEHOUSE_INGEST_CHUNK_ROWS", "LAKEHOUSE_PG_DSN", "LAKEHOUSE_SNAPSHOTS_KEEP")


def _sync_popen(d, env: dict) -> subprocess.Popen:
    return cli_sync_popen(d, env=env)


def _reverse_popen(d, env: dict) -> subprocess.Popen:
    """The operator's reverse apply of one dataset, ``lakehouse write-flags reverse sync``: its exit code and
    stderr are what the guide names."""
    return cli_popen("write-flags", "reverse", "sync", "--dataset", str(d), "--json", env=env)


def _reverse_actions(actions, infra: Infrastructure | None) -> list[tuple[str, int]]:
    """What a reverse cycle is armed from: REVERSE_ACTIONS, plus INFRA_ACTIONS given the infrastructure (and
    STORE_ACTIONS given an object store: for the whole apply, as its reads are what the store serves); of
    ``actions`` when given, those a reverse cycle takes (INFRA_ACTIONS alone: the infrastructure's faults only)."""
    takes = REVERSE_ACTIONS + (INFRA_ACTIONS if infra else []) + (STORE_ACTIONS if infra and infra.store else [])
    names = {a for a, _ in takes}
    chosen = [(a, w) for a, w in actions or () if a in names]
    return chosen or takes


def _run_script(script: str, arg: str, env: dict, report: Report, op: str) -> tuple[int, str]:
    """One cycle's process (a ``-c`` script with its one argument), waited for and counted: (exit code, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, arg], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    _, stderr = proc.communicate(timeout=180)
    report.outcomes[proc.returncode] += 1
    report.ops[op] += 1
    return proc.returncode, stderr


def _infra_cycle(
    infra: Infrastructure,
    spec: str,
    launch: Callable[[dict], subprocess.Popen],
    env: dict,
    rng: random.Random,
    window: tuple[float, float] = (0.3, 3.5),
) -> tuple[int, str, bool]:
    """One process (``launch(env)``: a sync, a reverse apply) and one infrastructure fault: at its failpoint (frozen
    there, broken, resumed), for ``anytime:`` at a random moment while it runs (``window``: seconds after its
    start, drawn uniformly), for ``whole:store-down`` and ``store-flaky`` all along. Returns its exit code, its
    stderr and whether the fault hit it (it had not ended yet)."""
    point, action = spec.split(":")
    if action == "store-flaky" or (point == "whole" and action == "store-down"):
        assert infra.store is not None
        if action == "store-down":  # down from before the process starts to its end
            infra.store.fail(503)
        else:
            infra.store.fail(503, share=0.33, seed=rng.randrange(1 << 30))
        proc = launch(env)
        try:
            _, stderr = proc.communicate(timeout=300)
        finally:
            infra.store.pass_through()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, stderr, True
    if point == "anytime":
        proc = launch(env)
        time.sleep(rng.uniform(*window))  # a sync's start-up is ~1.5-3 s of imports: some land before, most during
        fired = proc.poll() is None
        if fired:
            infra.restart()
    else:
        proc = launch({**env, "LAKEHOUSE_FAILPOINT": f"{point}:stop"})
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


def make_native(conn, dsn, catalog, settings, ws, name: str, rng: random.Random) -> tuple[uuid.UUID, int]:
    """A dataset made ready the runbook's way (mirrored, every Iceberg-servable reader on iceberg, canary ok) and
    both its writers set to iceberg_native (overrides, ungated: the flip gates are not what is tested here), its
    reverse applied once (Postgres already holds every row). Returns it and the next row_index to append."""
    d = app_tables.create_dataset(conn, ws, name, NATIVE_SCHEMA)
    app_tables.insert_rows(conn, d, [_row(rng, NATIVE_SCHEMA) for _ in range(rng.randint(0, 200))])
    sync_dataset(dsn, catalog, settings, d, mode="full", readers=1)
    for r in registry.READERS.values():
        if registry.rank("read", r.ceiling) >= registry.rank("read", "iceberg"):
            set_override(conn, "read", r.name, "iceberg", dataset=d, note="crash harness", actor="crash-harness")
    verdicts = [v.verdict for v in run_canary_and_roll_back(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results]
    if verdicts != [canary.OK]:
        raise RuntimeError(f"the native dataset {d} is not ready: canary {verdicts}")
    for writer, _ in NATIVE_WRITERS:
        set_override(conn, "write", writer, "iceberg_native", dataset=d, note="crash harness", actor="crash-harness")
    apply_reverse(dsn, catalog, settings, d)
    table = load_table_or_none(catalog, table_identifier(settings, d))
    assert table is not None  # mirrored above
    return d, int(table.properties.get(MAX_ROW_INDEX, -1)) + 1


def _native_value(rng: random.Random, type_: str):
    v = _value(rng, type_)
    if type_ == "float64" and isinstance(v, str):
        return float(v)  # "NaN", "Infinity"
    if type_ == "json" and v is not None:
        return json.dumps(v, separators=(", ", ": "))
    return v


def native_change(conn, catalog, settings, d: uuid.UUID, native: dict, rng: random.Random, report: Report) -> str:
    """One native write of the dataset through the real write router and the native table writer: an append of
    1-300 rows after the table's last row_index, or an overwrite of the whole table (sync.full) with 1-300 new
    rows. Returns the writer."""
    writer = rng.choices([w for w, _ in NATIVE_WRITERS], weights=[w for _, w in NATIVE_WRITERS])[0]
    dataset = app_tables.get_dataset(conn, d)
    schema = arrow_schema(dataset.columns)
    n = rng.randint(1, 300)
    start = 0 if writer == "sync.full" else native[d]
    now = dt.datetime.now(dt.UTC)
    columns = {c.name: [_native_value(rng, c.type) for _ in range(n)] for c in dataset.columns}
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(range(start, start + n), pa.int64()),
            pa.array([str(uuid.uuid4()) for _ in range(n)]),
            pa.array([now] * n, pa.timestamp("us", tz="UTC")),
        ]
        + [pa.array(columns[c.name], schema.field(c.name).type) for c in dataset.columns],
        schema=schema,
    )
    mode = registry.get_flag("write", writer).iceberg_mode
    assert mode is not None  # both writers have a native mode

    def iceberg_write(sync_id, source_version):
        plan = TableWrite(mode, sync_id, source_version, path="native", max_row_index=start + n - 1)
        return write_native_table(catalog, settings, dataset, [batch], plan, conn=conn)

    def pg_write():
        raise RuntimeError(f"{writer} resolved to pg for the native dataset {d}")

    route_write(
        conn,
        FlagResolver(conn, ttl_seconds=0),
        writer,
        d,
        pg_write=pg_write,
        iceberg_write=iceberg_write,
        settings=settings,
        catalog=catalog,
    )
    native[d] = start + n
    report.ops["native-overwrite" if writer == "sync.full" else "native-append"] += 1
    return writer


def _tracking(conn, d) -> tuple:
    """What change tracking says of the dataset: a reverse apply moves none of it (no echo)."""
    return conn.execute(
        "select d.rows_version, d.rows_xid, d.rows_rewrite_version, d.mirrored_version,"
        " (select count(*) from lakehouse_row_changes c where c.dataset_id = d.id) from datasets d where d.id = %s",
        (d,),
    ).fetchone()


def _counts(conn, d) -> tuple[int, int]:
    return tuple(conn.execute("select row_count, max_row_index from datasets where id = %s", (d,)).fetchone())


def _pg_identity(conn, d) -> list[tuple]:
    return conn.execute(
        "select row_index, row_id::text, created_at from dataset_rows where dataset_id = %s order by row_index",
        (d,),
    ).fetchall()


def _table_identity(table, snapshot_id: int) -> list[tuple]:
    rows = (
        table.scan(snapshot_id=snapshot_id, selected_fields=("__row_index", "__row_id", "__created_at"))
        .to_arrow()
        .to_pylist()
    )
    return sorted((r["__row_index"], r["__row_id"], r["__created_at"]) for r in rows)


def reverse_cycle(  # noqa: C901 - one reverse crash cycle: arm, run, restart, check in order
    conn, dsn, oracle, settings, d, native, rng, report, cycle, armed_share, actions=REVERSE_ACTIONS, infra=None
):
    """One reverse cycle of a native dataset; returns (the failpoint armed, the process's exit code, the harness's
    session: another one after a Postgres restart).

    A native change (an append, or an overwrite: a full reverse re-sync) lands in Iceberg; ``apply_reverse`` runs
    in its own process with a failpoint armed (or none) and is killed, terminated or failed there; Postgres must
    then hold a whole snapshot, the previous one when the failpoint was before the commit (the rows, the count and
    the position: nothing half-applied, a full re-sync's delete included) and the new one after it. One clean
    apply in this process follows, and must apply exactly when the killed one did not commit. Then the oracle:
    ``dataset_rows`` is the current snapshot (identity row by row, values by the canary's digests read the
    reverse's way: ``reverse_parity`` ok), the position and the one reverse reconciliation name it,
    ``datasets.row_count`` / ``max_row_index`` are the rows', and no echo: change tracking did not move, the
    forward poller does not request the dataset and the recorder sees no write. Given ``infra`` and an infrastructure
    fault drawn from ``actions``, the process is the operator's ``lakehouse write-flags reverse sync`` through the
    fault proxy, frozen at its failpoint while Postgres restarts or its connections are reset (or Postgres restarted
    at any moment of it, after which either snapshot may be whole): it must end with an exit the operator guide
    names and one line, as a sync must. Long on purpose: the checks read in the order the cycle runs."""
    where = f"cycle {cycle} (native dataset {d}"
    try:
        writer = native_change(conn, oracle.catalog, settings, d, native, rng, report)
    except Exception as exc:  # noqa: BLE001 - a violation, reported with the cycle
        report.violations.append(f"{where}): the native write failed: {type(exc).__name__}: {exc}")
        return None, 0, conn
    table = oracle.table(d)
    current = table.current_snapshot().snapshot_id
    before = position(conn, d)
    prev = None if before is None else before.snapshot_id
    tracked = _tracking(conn, d)
    counted = _counts(conn, d)  # the native write's (the table's row count): only a committed apply moves them
    xid = int(conn.execute("select pg_current_xact_id()::text::bigint").fetchone()[0])
    spec = point = action = None
    if rng.random() < armed_share:
        point = rng.choice(REVERSE_POINTS)
        action = rng.choices([a for a, _ in actions], weights=[w for _, w in actions])[0]
        spec = (
            "reverse-anytime:pg-restart"
            if action == "anytime-pg-restart"
            else f"reverse-whole:{action}"
            if action in STORE
            else f"{point}:{action}"
        )
        report.armed[spec] += 1
    if infra is not None and spec is not None and action in {a for a, _ in INFRA_ACTIONS + STORE_ACTIONS}:
        env = cli_env(None, LAKEHOUSE_PG_DSN=infra.proxy.dsn(dsn), LAKEHOUSE_SNAPSHOTS_KEEP="0")
        rc, stderr, fired = _infra_cycle(
            infra,
            spec.removeprefix("reverse-") if spec.startswith(("reverse-anytime", "reverse-whole")) else spec,
            functools.partial(_reverse_popen, d),
            env,
            rng,
            window=(0.3, 2.0),  # ~1 s of imports, then the apply: some land before, most during
        )
        conn = _reconnect(conn, dsn)
        report.outcomes[rc] += 1
        report.ops["reverse"] += 1
        where = f"{where}, {writer}, reverse, failpoint {spec}, exit {rc})"
        if fired:
            report.fired[spec] += 1
        report.violations += [f"{where}: {v}" for v in _infra_outcome(rc, stderr, fired)]
    else:
        env = cli_env(spec, LAKEHOUSE_PG_DSN=dsn, LAKEHOUSE_SNAPSHOTS_KEEP="0")
        rc, stderr = _run_script(REVERSE_ONCE, str(d), env, report, "reverse")
        where = f"{where}, {writer}, reverse, failpoint {spec}, exit {rc})"
        fired = bool(spec) and (rc in (-9, -15) or "failpoint" in stderr)
        if fired:
            report.fired[spec] += 1
        elif rc != 0:
            report.violations.append(f"{where}: a reverse apply without a fired failpoint exited {rc}: {stderr[-300:]}")

    # right after the process: a whole snapshot, the previous one unless the process got past its commit (either,
    # when Postgres restarted at some moment of it: its commit may or may not have landed)
    at = position(conn, d)
    held = None if at is None else at.snapshot_id
    should_commit = not fired or point == "reverse-after-commit"
    if spec == "reverse-whole:store-down":  # nothing of the table could be read: nothing was written
        allowed = {prev}
    elif fired and spec in ("reverse-anytime:pg-restart", "reverse-whole:store-flaky"):  # its commit may have landed
        allowed = {prev, current}
    else:
        allowed = {current if should_commit else prev}
    if held not in allowed:
        report.violations.append(
            f"{where}: the position is {held} after the process; the previous snapshot is {prev}, the current {current}"
        )
    if held is not None:
        identity = _table_identity(table, held)
        if _pg_identity(conn, d) != identity:
            report.violations.append(f"{where}: dataset_rows is not snapshot {held} (the position) after the process")
        counts = _counts(conn, d)
        whole = (len(identity), identity[-1][0] if identity else -1) if held == current else counted
        if counts != whole:
            report.violations.append(
                f"{where}: datasets.row_count/max_row_index {counts} after the process, not {whole} (position {held})"
            )

    # the clean apply: it applies exactly when the process did not commit (no snapshot applied twice)
    try:
        result = apply_reverse(dsn, oracle.catalog, settings, d)
    except Exception as exc:  # noqa: BLE001 - a violation, reported with the cycle
        report.violations.append(f"{where}: the clean reverse apply failed: {type(exc).__name__}: {exc}")
        return spec, rc, conn
    committed = held == current
    if committed and result.how != "noop":
        report.violations.append(f"{where}: snapshot {current} applied twice (the clean apply did {result.how})")
    if not committed and result.how == "noop":
        report.violations.append(f"{where}: the clean apply did nothing, the position was {held} ({result.reason})")
    report.ops[f"reverse-{result.how if not committed else 'noop'}"] += 1
    report.violations += [f"{where}: {v}" for v in _reverse_oracle(conn, dsn, oracle, settings, d, current, xid)]
    if _tracking(conn, d) != tracked:
        report.violations.append(f"{where}: an echo: change tracking moved ({tracked} → {_tracking(conn, d)})")
    return spec, rc, conn


def _reverse_oracle(conn, dsn, oracle, settings, d, current: int, xid: int) -> list[str]:
    """After the clean apply: Postgres is the current snapshot, recorded once, without echo."""
    bad = []
    table = oracle.table(d)
    if table.current_snapshot().snapshot_id != current:
        bad.append(f"the table moved during the cycle ({current} → {table.current_snapshot().snapshot_id})")
    at = position(conn, d)
    if at is None or at.snapshot_id != current:
        bad.append(f"the position is {None if at is None else at.snapshot_id}, the current snapshot {current}")
    reconciled = conn.execute(
        "select snapshot_id from lakehouse_pg_reconciled where dataset_id = %s and how = 'reverse'", (d,)
    ).fetchall()
    if reconciled != [(current,)]:
        bad.append(f"reverse reconciliations {reconciled}, not one of snapshot {current}")
    identity = _table_identity(table, current)
    if _pg_identity(conn, d) != identity:
        bad.append(f"dataset_rows' identity is not snapshot {current}'s ({len(identity)} rows)")
    v = reverse_parity(dsn, oracle.catalog, settings, d)
    if v is None or v.verdict != canary.OK:
        bad.append(f"reverse parity {None if v is None else v.verdict}: {None if v is None else v.detail}")
    row_count, max_row_index = conn.execute(
        "select row_count, max_row_index from datasets where id = %s", (d,)
    ).fetchone()
    pg = conn.execute(
        "select count(*), coalesce(max(row_index), -1) from dataset_rows where dataset_id = %s", (d,)
    ).fetchone()
    if (row_count, max_row_index) != tuple(pg) or row_count != len(identity):
        bad.append(
            f"datasets.row_count/max_row_index {row_count}/{max_row_index}, dataset_rows {pg[0]}/{pg[1]}, "
            f"snapshot {len(identity)} rows"
        )
    pending, _, _ = pending_syncs(conn, Cursor(xid + 1), limit=1000, exclude_native=False)
    if d in {p.dataset_id for p in pending}:
        bad.append("an echo: the forward poller requests the dataset after the reverse apply")
    for stream in STREAMS:
        changes, _ = read_stream(conn, stream, Position(xid + 1), 100)
        if changes:
            bad.append(f"an echo: the recorder's {stream} stream sees {len(changes)} change(s), e.g. {changes[0]}")
    return bad
