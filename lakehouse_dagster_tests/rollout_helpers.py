"""Shared by the rollout-plan tests: a seeded mix of datasets, and the rollout_controller driven for real — the
sensor evaluated on a Dagster instance, each run it asks for executed in process with its config and tags."""

from __future__ import annotations

import dataclasses
import time
import uuid

import dagster as dg

from lakehouse_dagster.dagster.defs.flags.flags import set_flag_job
from lakehouse_dagster.dagster.defs.plans.controller import rollout_controller
from lakehouse_dagster.dagster.defs.plans.jobs import rollout_analysis_job
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.runbooks.complete import complete_job
from lakehouse_dagster.dagster.defs.runbooks.rollout import read_flip_job, write_flip_job
from lakehouse_dagster.flags.registry import READERS, WRITERS
from lakehouse_dagster.flags.stored import resolve_for, stored_overrides
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity import canary
from lakehouse_dagster.plans import store
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "a", "type": "int64"}, {"name": "s", "type": "string"}, {"name": "j", "type": "json"}]
JOBS = {j.name: j for j in (read_flip_job, write_flip_job, set_flag_job, rollout_analysis_job, complete_job)}


@dataclasses.dataclass
class Seeded:
    ws: uuid.UUID  # the workspace the plan widens to
    ws2: uuid.UUID  # another workspace (moved only by the global stage)
    tabular: dict[str, uuid.UUID]  # name → id
    manifest: uuid.UUID
    unsynced: uuid.UUID | None


def dataset(conn, dsn, settings, ws, name: str, rows: int = 6, *, synced: bool = True) -> uuid.UUID:
    d = datasets.create_dataset(conn, ws, name, SCHEMA)
    datasets.insert_rows(conn, d, [{"a": i, "s": f"{name}-{i}", "j": {"k": i, "n": [i, None]}} for i in range(rows)])
    if synced:
        sync_dataset(dsn, load_catalog(settings, dsn), settings, d, mode="full")
    return d


def seed_mix(conn, dsn, settings, *, unsynced: bool = False) -> Seeded:
    """Two workspaces: ws holds four synced tabular datasets of different sizes and a manifest dataset; ws2 one
    synced dataset. Every tabular one canaried ok (what a reader's candidates need)."""
    ws = datasets.create_workspace(conn, "ws-main")
    ws2 = datasets.create_workspace(conn, "ws-other")
    tab = {
        name: dataset(conn, dsn, settings, ws, name, rows)
        for name, rows in (("small", 3), ("mid", 6), ("big", 12), ("wide", 8))
    }
    tab["elsewhere"] = dataset(conn, dsn, settings, ws2, "elsewhere", 5)
    manifest = datasets.create_dataset(conn, ws, "files", [], kind="manifest")
    late = dataset(conn, dsn, settings, ws, "late", 4, synced=False) if unsynced else None
    canary.run_canary(
        conn, dsn, load_catalog(settings, dsn), settings, dataset_ids=[str(i) for i in tab.values()], smoke=True
    )
    return Seeded(ws, ws2, tab, manifest, late)


def behind_the_mirrors_back(conn, d: uuid.UUID, row_index: int = 2) -> None:
    """Change a value with the triggers bypassed: Postgres's version does not move, the mirror thinks it is caught
    up, only a canary that reads the values (smoke, full digest) sees the difference."""
    with conn.transaction():
        conn.execute("alter table dataset_rows disable trigger user")
        conn.execute(
            "update dataset_rows set data = jsonb_set(data, '{a}', '-1') where dataset_id = %s and row_index = %s",
            (d, row_index),
        )
        conn.execute("alter table dataset_rows enable trigger user")


def effective_modes(conn) -> dict:
    """Every reader's and writer's effective mode for every dataset, and every override: "every flag"."""
    ds = conn.execute("select id, workspace_id from datasets").fetchall()
    out = {}
    for kind, flags in (("read", READERS), ("write", WRITERS)):
        stored = stored_overrides(conn, kind, list(flags))
        for name, flag in flags.items():
            for d, ws in ds:
                out[(kind, name, d)] = resolve_for(flag, stored[name], d, ws)
    return out


class Driver:
    """The controller as the daemon runs it: evaluate the sensor, launch what it asks for, repeat."""

    def __init__(self, instance: dg.DagsterInstance, dsn: str):
        self.instance, self.dsn = instance, dsn
        self.cursor: str | None = None
        self.launched: list[dg.RunRequest] = []
        self.results: list = []

    def tick(self, *, launch: bool = True):
        ctx = dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources={"lakehouse": LakehouseResource(pg_dsn=self.dsn)}
        )
        res = rollout_controller(ctx)
        self.cursor = res.cursor or self.cursor
        if launch:
            for req in res.run_requests:
                self.launch(req)
        return res

    def launch(self, req: dg.RunRequest):
        self.launched.append(req)
        result = JOBS[req.job_name].execute_in_process(
            run_config=req.run_config,
            tags=req.tags,
            instance=self.instance,
            resources={"lakehouse": LakehouseResource(pg_dsn=self.dsn)},
            raise_on_error=False,
        )
        self.results.append(result)
        return result

    def until(self, conn, plan_id, predicate, *, timeout: float = 90, between=None, pause: float = 0.2):
        """Tick until ``predicate(plan row)``; ``between(plan row)`` runs after each tick (a test's interference)."""
        deadline = time.monotonic() + timeout
        while True:
            self.tick()
            p = store.get(conn, plan_id)
            if predicate(p):
                return p
            if between is not None:
                between(p)
            if time.monotonic() > deadline:
                raise AssertionError(f"plan {plan_id} stuck: {p.state} stage {p.stage} {p.phase}: {p.blocking}")
            time.sleep(pause)


def plan_audit(conn, plan_id) -> list[tuple]:
    """Every flag audit row that names the plan: (action, kind, name, scope, scope_id, before, after, note)."""
    return conn.execute(
        "select action, kind, name, scope, scope_id, before_mode, after_mode, note from lakehouse_flag_audit"
        " where note like %s order by id",
        (f"rollout {plan_id}%",),
    ).fetchall()
