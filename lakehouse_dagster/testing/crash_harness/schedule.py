"""What a crash cycle draws and does to the data: the failpoints and actions with their weights, the
infrastructure it may break, the report it keeps, and the random changes to a dataset (the package's docstring)."""

from __future__ import annotations

import collections
import dataclasses
import json
import random
import re
import uuid
from collections.abc import Callable

from lakehouse_dagster.testing.http_fault_proxy import S3FaultProxy
from lakehouse_dagster.testing.tcp_proxy import TcpProxy
from lakehouse_dagster.tracking import datasets as app_tables

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
for e in stream_shard(s.postgres.dsn, load_catalog(s, s.postgres.dsn), s, shard=0, shard_count=1, run_id=sys.argv[1],
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
print(apply_reverse(s.postgres.dsn, load_catalog(s, s.postgres.dsn), s, sys.argv[1]).how)
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
