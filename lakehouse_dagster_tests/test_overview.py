"""The migration overview (status/overview.py, status/lag.py) on a seeded mix of stages: its counts equal direct SQL
counts, its attention list names exactly the datasets that need an operator, and the Dagster asset records the
counts as numeric metadata; `lakehouse status` prints the same computation."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid

import dagster as dg
import psycopg
import pytest
from psycopg.types.json import Jsonb

from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import MIGRATION_OVERVIEW
from lakehouse_dagster.dagster.defs.status.overview import (
    ROLLOUT_JOBS,
    migration_overview,
    migration_overview_after_rollout,
    migration_overview_job,
    partition_page,
)
from lakehouse_dagster.flags.candidates import RUNBOOK_SAFE_BLOCKED
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.registry import FLIPPABLE_WRITERS, SERVABLE_READERS
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.shards import STREAM_OFF, shard_status
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity import canary
from lakehouse_dagster.status import lag
from lakehouse_dagster.status.overview import compute_overview, runbook_blocked
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]
READERS = [r.name for r in SERVABLE_READERS]


def _dataset(conn, ws, name, rows=3, kind="tabular"):
    d = datasets.create_dataset(conn, ws, name, SCHEMA, kind=kind)
    if rows:
        datasets.insert_rows(conn, d, [{"n": i, "s": f"{name}-{i}"} for i in range(rows)])
    return d


def _sync(settings, dsn, d):
    return sync_dataset(dsn, load_catalog(settings, dsn), settings, d, mode="full")


def _canary(settings, dsn, conn, d):
    v = canary.evaluate(dsn, load_catalog(settings, dsn), settings, d)
    canary.record(conn, v, source="canary")
    return v.verdict


def _set(conn, kind, name, mode, **scope):
    set_override(conn, kind, name, mode, note="test", actor="pytest", **scope)


def _seed(conn, dsn, settings) -> dict[str, uuid.UUID]:
    """One dataset per stage and problem (names say which), over two workspaces."""
    alpha = datasets.create_workspace(conn, "alpha")
    beta = datasets.create_workspace(conn, "beta")
    ds = {
        "pg_only": _dataset(conn, alpha, "pg_only"),
        "mirrored": _dataset(conn, alpha, "mirrored"),
        "read_flipped": _dataset(conn, alpha, "read_flipped"),
        "ws_a": _dataset(conn, beta, "ws_a"),
        "ws_b": _dataset(conn, beta, "ws_b"),
        "native": _dataset(conn, alpha, "native"),
        "native_unsafe": _dataset(conn, alpha, "native_unsafe"),
        "blocked": _dataset(conn, alpha, "blocked"),
        "mismatch": _dataset(conn, alpha, "mismatch"),
        "wedged": _dataset(conn, alpha, "wedged"),
        "lagging": _dataset(conn, alpha, "lagging"),
        "empty": _dataset(conn, alpha, "empty", rows=0),
    }
    datasets.create_dataset(conn, alpha, "files", SCHEMA, kind="manifest")  # file-backed: not in the overview
    for name in ("mirrored", "read_flipped", "ws_a", "ws_b", "native", "native_unsafe", "blocked", "mismatch"):
        _sync(settings, dsn, ds[name])
    _sync(settings, dsn, ds["wedged"])
    _sync(settings, dsn, ds["lagging"])
    assert _canary(settings, dsn, conn, ds["mirrored"]) == "ok"
    # reads on Iceberg at dataset scope, and at workspace scope (beta: iceberg for export.stream, iceberg_only for
    # graph.kuzu), with a dataset override narrowing one of them back (most specific wins)
    _set(conn, "read", "export.stream", "iceberg", dataset=ds["read_flipped"])
    _set(conn, "read", "export.stream", "iceberg", workspace=beta)
    _set(conn, "read", "graph.kuzu", "iceberg_only", workspace=beta)
    _set(conn, "read", "graph.kuzu", "off", dataset=ds["ws_b"])
    # a flip of a dataset never mirrored is inert (the freshness gate serves Postgres): it stays on postgres
    _set(conn, "read", "export.stream", "iceberg", dataset=ds["pg_only"])
    # native: the runbook's way (every servable reader on iceberg, canary ok), then sync.full iceberg_native
    for r in READERS:
        _set(conn, "read", r, "iceberg", dataset=ds["native"])
    assert _canary(settings, dsn, conn, ds["native"]) == "ok"
    _set(conn, "write", "sync.full", "iceberg_native", dataset=ds["native"])
    # native but unsafe: a writer set native by hand (ungated) while its readers are still on Postgres
    _set(conn, "write", "sync.append", "iceberg_native", dataset=ds["native_unsafe"])
    # blocked (F3): a pipeline reads it as input
    conn.execute(
        "insert into pipelines (workspace_id, name, spec) values (%s, 'nightly', %s)",
        (alpha, Jsonb({"nodes": [{"type": "dataset", "data": {"datasetId": str(ds["blocked"])}}]})),
    )
    # ... and its reverse mirror is off (with it on a pipeline input is SAFE: test_reverse_gates.py)
    set_reverse(conn, False, dataset=ds["blocked"], note="reverse off", actor="pytest")
    # MISMATCH: a row changed with the triggers bypassed, then the canary
    with conn.transaction():
        conn.execute("alter table dataset_rows disable trigger user")
        conn.execute("update dataset_rows set data = '{}' where dataset_id = %s and row_index = 1", (ds["mismatch"],))
        conn.execute("alter table dataset_rows enable trigger user")
    assert _canary(settings, dsn, conn, ds["mismatch"]) == "MISMATCH"
    # wedged: its latest sync has been running for two hours (its process died)
    conn.execute(
        "update iceberg_sync_log set started_at = now() - interval '3 hours' where dataset_id = %s", (ds["wedged"],)
    )
    conn.execute(
        "insert into iceberg_sync_log (dataset_id, sync_id, status, started_at) values (%s, %s, 'running', %s)",
        (ds["wedged"], uuid.uuid4(), dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)),
    )
    # lagging: synced two hours ago, written since
    conn.execute(
        "update iceberg_sync_log set finished_at = now() - interval '2 hours' where dataset_id = %s", (ds["lagging"],)
    )
    datasets.insert_rows(conn, ds["lagging"], [{"n": 9, "s": "late"}])
    return ds


def _sql_counts(conn) -> dict:
    """What the overview must say, counted straight from the tables (no code of the project)."""
    one = lambda q: conn.execute(q).fetchone()[0]  # noqa: E731
    return {
        "datasets": one("select count(*) from datasets where kind = 'tabular'"),
        "mirrored": one(
            "select count(*) from datasets d where kind = 'tabular' and exists"
            " (select 1 from iceberg_sync_log l where l.dataset_id = d.id and l.status = 'succeeded')"
        ),
        "verdicts": dict(
            conn.execute(
                "select verdict, count(*) from (select distinct on (p.dataset_id) p.verdict from lakehouse_read_parity p"
                " join datasets d on d.id = p.dataset_id and d.kind = 'tabular'"
                " order by p.dataset_id, p.checked_at desc, p.id desc) v group by verdict"
            ).fetchall()
        ),
        "behind": one(
            "select count(*) from datasets where kind = 'tabular' and coalesce(mirrored_version, -1) < rows_version"
        ),
        "never_synced": one(
            "select count(*) from datasets d where kind = 'tabular' and not exists"
            " (select 1 from iceberg_sync_log l where l.dataset_id = d.id and l.status = 'succeeded')"
        ),
    }


def test_overview_counts_equal_sql_counts_and_the_attention_list_is_exact(conn, dsn, settings):
    ds = _seed(conn, dsn, settings)
    ov = compute_overview(conn, settings)
    sql = _sql_counts(conn)

    assert ov.datasets == sql["datasets"] == 12
    # every flag's stages add up to the tabular datasets
    for stages in ov.flag_stages.values():
        assert sum(stages.values()) == sql["datasets"]
    assert sum(ov.dataset_stages.values()) == sql["datasets"]
    # never mirrored: pg_only (export.stream flipped for it, inert) and empty, for every reader and writer
    for (kind, name), stages in ov.flag_stages.items():
        assert stages["postgres"] == sql["datasets"] - sql["mirrored"] == 2, (kind, name)
    assert ov.flag_stages[("read", "export.stream")] == {
        "postgres": 2,
        "mirrored": 6,  # mirrored, native_unsafe, blocked, mismatch, wedged, lagging
        "reads_iceberg": 4,  # read_flipped (dataset scope), ws_a and ws_b (workspace beta), native
        "iceberg_only": 0,
    }
    assert ov.flag_stages[("read", "graph.kuzu")] == {
        "postgres": 2,
        "mirrored": 8,  # ... and read_flipped, and ws_b (its dataset override wins over beta's iceberg_only)
        "reads_iceberg": 1,  # native
        "iceberg_only": 1,  # ws_a (workspace scope)
    }
    assert ov.flag_stages[("write", "sync.full")] == {"postgres": 2, "mirrored": 8, "blocked": 1, "native": 1}
    assert ov.flag_stages[("write", "sync.append")] == {"postgres": 2, "mirrored": 8, "blocked": 1, "native": 1}
    assert ov.flag_stages[("write", "cdc.append")] == {"postgres": 2, "mirrored": 9, "blocked": 1, "native": 0}
    assert ov.dataset_stages == {"postgres": 2, "mirrored": 5, "reads_iceberg": 3, "native": 2}
    assert ov.blocked == 1 and ov.native == 2 and ov.native_unsafe == 1
    # blocked is what the runbook's own step-2b query says, asked per pipeline input
    with conn.cursor() as cur:
        cur.execute(RUNBOOK_SAFE_BLOCKED.encode())
        assert runbook_blocked(conn) == {r[3] for r in cur.fetchall() if r[0] == "BLOCKED (pipeline input)"}

    verdicts = {k: v for k, v in ov.verdicts.items() if v}
    assert verdicts == {**sql["verdicts"], "unchecked": sql["datasets"] - sum(sql["verdicts"].values())}
    assert verdicts == {"ok": 2, "MISMATCH": 1, "unchecked": 9}
    assert ov.wedged == 1
    assert ov.behind == sql["behind"] == 3  # lagging, and the never-synced pg_only and empty
    assert ov.never_synced == sql["never_synced"] == 2
    assert ov.lagging == 1 and 7100 < ov.max_lag_seconds < 7300

    # exactly the datasets that need an operator, most urgent first, with their workspace and why
    listed = {a.name: a for a in ov.attention}
    assert [a.name for a in ov.attention] == ["mismatch", "native_unsafe", "wedged", "lagging", "blocked"]
    assert ov.attention_total == 5
    assert ov.problems == {
        "MISMATCH": 1,
        "native-unsafe": 1,
        "check error": 0,
        "wedged": 1,
        "lagging": 1,
        "read fallback": 0,
        "blocked": 1,
    }
    assert all(a.workspace == "alpha" for a in ov.attention)
    assert listed["mismatch"].dataset_id == ds["mismatch"] and "STOP" in listed["mismatch"].reason
    assert "readers still on Postgres" in listed["native_unsafe"].reason
    assert "running since" in listed["wedged"].reason
    assert "past 3600 s" in listed["lagging"].reason
    assert listed["blocked"].reason.startswith(
        "BLOCKED (pipeline input; reverse mirror off): nightly reads it from dataset_rows (F3)"
    )
    assert f"turn it on with `lakehouse reverse on --dataset {ds['blocked']}`" in listed["blocked"].reason
    assert partition_page(ds["blocked"]) == f"/assets/iceberg/dataset_table?view=partitions&partition={ds['blocked']}"

    # `lakehouse status` prints the same computation
    out = json.loads(cli("status", "--json", check=True).stdout)
    assert out["dataset_stages"] == ov.dataset_stages and out["verdicts"] == ov.verdicts
    assert [a["name"] for a in out["attention"]] == [a.name for a in ov.attention]
    text = cli("status", check=True).stdout
    assert (
        "12 tabular dataset(s): 2 on Postgres only, 5 mirrored, 3 read from Iceberg, 2 written iceberg-native" in text
    )
    assert f"mismatch ({ds['mismatch']}) workspace alpha" in text


def test_the_asset_records_the_counts_as_numeric_metadata_and_the_attention_table(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "alpha")
    ok = _dataset(conn, ws, "ok")
    late = _dataset(conn, ws, "late")
    _sync(settings, dsn, ok)
    _sync(settings, dsn, late)
    conn.execute("update iceberg_sync_log set finished_at = now() - interval '2 hours' where dataset_id = %s", (late,))
    datasets.insert_rows(conn, late, [{"n": 9, "s": "x"}])
    _set(conn, "read", "export.stream", "iceberg", dataset=ok)
    with dg.DagsterInstance.ephemeral() as instance:
        resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
        assert dg.materialize([migration_overview], instance=instance, resources=resources).success
        datasets.insert_rows(conn, ok, [{"n": 9, "s": "x"}])  # now behind too (within the threshold)
        assert dg.materialize([migration_overview], instance=instance, resources=resources).success
        records = instance.fetch_materializations(MIGRATION_OVERVIEW, limit=10).records
    first, second = (r.asset_materialization.metadata for r in reversed(records))
    for meta in (first, second):  # numeric, so the UI plots each key as one series over materializations
        for key in ("datasets", "stage/mirrored", "reader export.stream: reads_iceberg", "verdict/unchecked", "behind"):
            assert isinstance(meta[key], dg.IntMetadataValue), key
        assert isinstance(meta["max_lag_seconds"], dg.FloatMetadataValue)
        assert meta["datasets"].value == 2 and meta["reader export.stream: reads_iceberg"].value == 1
        assert meta["writer sync.full: mirrored"].value == 2 and meta["lagging"].value == 1
        assert meta["attention/lagging"].value == 1 and meta["attention_total"].value == 1
        table = meta["attention"]
        assert isinstance(table, dg.TableMetadataValue)
        # three narrow columns that fit the asset page (issue 33); the page is linked from attention_links
        assert [c.name for c in table.schema.columns] == ["dataset", "problem", "reason"]
        (rec,) = table.records
        assert rec.data["dataset"] == "late (alpha)" and rec.data["problem"] == "lagging"
        assert len(rec.data["reason"]) <= 90
        assert (
            f"[late](/assets/iceberg/dataset_table?view=partitions&partition={late})" in meta["attention_links"].value
        )
    assert (first["behind"].value, second["behind"].value) == (1, 2)
    # streaming off (the default): the shards' block says so in one line, its counts are zeros
    assert first["mirror_stream"].value == STREAM_OFF and first["stream/shards"].value == 0
    keys = {f"reader {r.name}: {s}" for r in SERVABLE_READERS for s in ("mirrored", "reads_iceberg")}
    keys |= {f"reader {r.name}: iceberg_only" for r in SERVABLE_READERS if r.ceiling == "iceberg_only"}
    keys |= {f"writer {w.name}: {s}" for w in FLIPPABLE_WRITERS for s in ("mirrored", "blocked", "native")}
    assert keys <= set(first) and keys <= set(second)
    # not plotted: a stage above the reader's ceiling, and any flag's postgres (stage/postgres plots it once)
    assert "reader studio.digest: iceberg_only" not in first and "reader export.stream: postgres" not in first


def test_the_overview_opens_with_readers_and_writers_by_stage_the_lifecycle_and_the_attention_list(conn, dsn, settings):
    """Issue 44: the migration at a glance is one table (who × stage, the blocked datasets named) and the attention
    list, first; the ~80 numbers stay below for the Plots view, each key short enough (or broken by spaces) that the
    UI's key column never runs into the next one."""
    from lakehouse_dagster.dagster.defs.status.overview import GLANCE_COLUMNS, KEY_WORD_CHARS, MD_INLINE_CHARS

    ds = _seed(conn, dsn, settings)
    with dg.DagsterInstance.ephemeral() as instance:
        resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
        assert dg.materialize([migration_overview], instance=instance, resources=resources).success
        (record,) = instance.fetch_materializations(MIGRATION_OVERVIEW, limit=1).records
    meta = record.asset_materialization.metadata
    assert list(meta)[:3] == ["migration", "attention_links", "attention"]
    ov = compute_overview(conn, settings)
    glance = meta["migration"].value
    assert len(glance) < MD_INLINE_CHARS  # shown inline, not behind "[Show Markdown]"
    lines = glance.splitlines()
    states = " · ".join(f"{k} {v}" for k, v in ov.lifecycle.items() if v)
    assert lines[0] == f"**{ov.datasets} datasets** · lifecycle: {states}" and "native 2" in states
    assert lines[2] == "| | postgres | mirrored | reads iceberg | iceberg only | blocked | native |"
    rows = {
        c[0]: dict(zip(GLANCE_COLUMNS, c[1:])) for c in ([x.strip() for x in r.split("|")[1:-1]] for r in lines[4:])
    }
    who = {
        (k, n): f"{'reader' if k == 'read' else 'writer'} {n.replace('_', chr(92) + '_')}" for k, n in ov.flag_stages
    }
    assert list(rows) == ["**datasets**", *who.values()]
    for (kind, name), stages in ov.flag_stages.items():  # the same counts as the numeric series
        for stage in GLANCE_COLUMNS:
            n = meta.get(f"{'reader' if kind == 'read' else 'writer'} {name}: {stage}")
            cell = rows[who[(kind, name)]][stage]
            assert cell == "·" if stage not in stages else cell.strip("*").split(":")[0] == str(stages[stage])
            assert n is None if stage == "postgres" or stage not in stages else n.value == stages[stage]
    assert rows["reader studio.digest"]["iceberg_only"] == "·"  # its ceiling is iceberg
    assert ov.blocked == 1 and rows["writer sync.full"]["blocked"] == "**1: blocked**"  # named, not only counted
    assert rows["**datasets**"]["native"] == str(ov.dataset_stages["native"]) == "2"
    assert {f"lifecycle/{state}" for state in ov.lifecycle} <= set(meta)
    assert "blocked" in meta["attention_links"].value and str(ds["blocked"]) in meta["attention_links"].value
    long = [k for k in meta if any(len(word) > KEY_WORD_CHARS for word in k.split())]
    assert not long, long


def test_the_overview_asset_fits_the_entries_the_ui_shows_without_show_more(conn, dsn, settings):
    """The asset page lists a materialization's first 100 metadata entries and hides the rest behind "Show N more"
    (dagster-webserver's MetadataTable ``displayedByDefault``). Seen failing on main: with the held-on-Postgres
    entries the overview had 113 (116 once every compute reader has a rate), so the rollouts' counts, added last,
    were hidden (the e2e browser check's "rollouts/live"). The worst case: every compute reader with a rate."""
    from lakehouse_dagster.dagster.defs.status.overview import overview_metadata, plans_metadata
    from lakehouse_dagster.flags.registry import PROVEN_READERS
    from lakehouse_dagster.status.overview import ShadowSummary

    shown = 100  # UI_ENTRIES
    _seed(conn, dsn, settings)
    ov = compute_overview(conn, settings)
    worst = dataclasses.replace(ov, shadow=[ShadowSummary(r.name, 2, 1, 5, 1, 3) for r in PROVEN_READERS])
    meta = {**overview_metadata(worst), **plans_metadata([])}
    assert all(x.rate is not None for x in worst.shadow)
    assert len(meta) <= shown, len(meta)
    assert {"rollouts/live", "rollouts/paused", "seconds", "held_total"} <= set(meta)


def test_a_rollout_job_run_refreshes_the_overview():
    @dg.op
    def step():
        return 1

    with dg.DagsterInstance.ephemeral() as instance:
        for job_name, wanted in [("write_flip", True), ("mirror_batch_job", False)]:
            job = dg.JobDefinition(graph_def=dg.GraphDefinition(name=job_name, node_defs=[step]))
            result = job.execute_in_process(instance=instance)
            ctx = dg.build_run_status_sensor_context(
                sensor_name=migration_overview_after_rollout.name,
                dagster_instance=instance,
                dagster_run=result.dagster_run,
                dagster_event=next(e for e in result.all_events if e.event_type == dg.DagsterEventType.RUN_SUCCESS),
            )
            request = migration_overview_after_rollout(ctx)
            if wanted:
                assert isinstance(request, dg.RunRequest) and request.run_key == f"overview-after:{result.run_id}"
            else:
                assert isinstance(request, dg.SkipReason)
    assert "write_flip" in ROLLOUT_JOBS
    assert migration_overview_after_rollout.job_name == migration_overview_job.name


@pytest.mark.parametrize("threshold", [60, 10_000])
def test_lag_behind_lagging_and_flipped_freshness(conn, dsn, settings, threshold):
    ws = datasets.create_workspace(conn, "w")
    caught_up, behind, never, native = (_dataset(conn, ws, n) for n in ("caught_up", "behind", "never", "native"))
    for d in (caught_up, behind, native):
        _sync(settings, dsn, d)
    conn.execute("update iceberg_sync_log set finished_at = now() - interval '1000 seconds'")
    datasets.insert_rows(conn, behind, [{"n": 9, "s": "x"}])
    datasets.insert_rows(conn, native, [{"n": 9, "s": "x"}])  # a row.edit of a native dataset: not behind
    _set(conn, "write", "sync.full", "iceberg_native", dataset=native)

    found = {b.dataset_id: b for b in lag.behind_datasets(conn)}
    assert set(found) == {behind, never}
    assert found[never].never_synced and found[never].lag_seconds is None and found[never].mirrored_version is None
    assert not found[behind].never_synced and 990 < found[behind].lag_seconds < 1100
    assert [b.dataset_id for b in lag.behind_datasets(conn)] == [never, behind]  # never synced first, then oldest
    lagging = lag.lagging_past(list(found.values()), threshold)
    assert [b.dataset_id for b in lagging] == ([behind] if threshold < 1000 else [])

    # only native is flipped so far (its writer is above its default): settled, whatever its Postgres version
    assert lag.flipped_freshness(conn, threshold) == lag.FlippedFreshness([], {native})
    _set(conn, "read", "export.stream", "iceberg", workspace=ws)
    ff = lag.flipped_freshness(conn, threshold)
    assert [b.dataset_id for b in ff.lagging] == ([behind] if threshold < 1000 else [])
    assert ff.settled == ({caught_up, native} if threshold < 1000 else {caught_up, native, behind})


def test_the_code_location_has_the_overview_its_refreshes_and_the_freshness_timer():
    from lakehouse_dagster.dagster.definitions import defs

    d = defs()
    keys = {k.to_user_string() for k in d.resolve_asset_graph().get_all_asset_keys()}
    assert "lakehouse/migration_overview" in keys
    assert d.resolve_job_def("migration_overview_job") is not None
    assert d.resolve_schedule_def("migration_overview_schedule").cron_schedule == "*/5 * * * *"
    for sensor in (
        "migration_overview_after_rollout",
        "migration_overview_after_failed_rollout",
        "flipped_freshness_checks",
    ):
        assert d.resolve_sensor_def(sensor) is not None
    jobs = {j.name for j in d.resolve_all_job_defs()}
    assert set(ROLLOUT_JOBS) <= jobs  # the rollout jobs the refresh names exist under those names


def test_the_overview_and_lakehouse_status_show_each_live_rollout_plan(conn, dsn, settings, capsys):
    from lakehouse_dagster.cli.main import main
    from lakehouse_dagster.plans import actions
    from lakehouse_dagster_tests.rollout_helpers import seed_mix

    s = seed_mix(conn, dsn, settings)
    plan_id, _ = actions.start(
        conn,
        settings,
        f"reader: graph.kuzu\nstages:\n  - datasets: 1\n  - workspace: {s.ws}\n    approval: true\n",
        actor="pytest",
    )
    actions.pause(conn, plan_id, actor="ops", reason="hold for the graph team")
    with dg.DagsterInstance.ephemeral() as instance:
        resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
        assert dg.materialize([migration_overview], instance=instance, resources=resources).success
        (record,) = instance.fetch_materializations(MIGRATION_OVERVIEW, limit=1).records
    meta = record.asset_materialization.metadata
    assert (meta["rollouts/live"].value, meta["rollouts/paused"].value) == (1, 1)
    (row,) = meta["rollouts"].records
    assert row.data["plan"] == str(plan_id) and row.data["moves"] == "reader graph.kuzu → iceberg"
    assert row.data["state"] == "paused" and row.data["stage"].startswith("1 of 2: ")
    assert row.data["next_action"] == f"lakehouse rollout resume {plan_id} (or abort {plan_id})"
    assert "hold for the graph team" in row.data["blocking"]
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "rollout plans: 1 live" in out
    assert f"plan {plan_id}: reader graph.kuzu → iceberg: paused, stage 1 of 2" in out
    actions.abort(conn, settings.project, plan_id, actor="ops", reason="done looking")
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rollouts"] == []  # an ended plan is no longer live


def _shard_row(conn, shard, count, run_id, *, beat_s_ago, ended=False, lag=0.0, backlog=0, commit_s_ago=None):
    """A stream's heartbeat row as mirror/stream.py ``ShardLease`` writes it, its times ``… seconds ago``."""
    conn.execute(
        """insert into lakehouse_mirror_streams (shard_count, shard, run_id, started_at, heartbeat_at, deadline_at,
                  ended_at, last_commit_at, syncs, failures, backlog, lag_seconds)
           values (%(count)s, %(shard)s, %(run)s, now() - interval '600 seconds', now() - make_interval(secs => %(beat)s),
                   now() + interval '300 seconds', case when %(ended)s then now() - make_interval(secs => %(beat)s) end,
                   now() - make_interval(secs => %(commit)s), 12, 1, %(backlog)s, %(lag)s)
           on conflict (shard_count, shard) do update set run_id = excluded.run_id,
                  heartbeat_at = excluded.heartbeat_at, ended_at = excluded.ended_at""",
        {
            "count": count,
            "shard": shard,
            "run": run_id,
            "beat": beat_s_ago,
            "ended": ended,
            "commit": commit_s_ago,
            "backlog": backlog,
            "lag": lag,
        },
    )


def test_the_overview_and_lakehouse_status_show_each_stream_shard_alive_or_down(conn, settings, capsys, monkeypatch):
    from lakehouse_dagster.cli.main import main
    from lakehouse_dagster.dagster.defs.status.overview import MD_INLINE_CHARS, overview_metadata, stream_markdown
    from lakehouse_dagster.mirror.shards import shard_state
    from lakehouse_dagster.status.overview_text import text_lines

    off = compute_overview(conn, settings)  # streaming off: one line says so, the counts are zeros
    assert STREAM_OFF in text_lines(off) and off.as_dict()["mirror_stream"]["on"] is False
    meta = overview_metadata(off)
    assert meta["mirror_stream"].value == STREAM_OFF and meta["stream/shards"].value == 0
    assert meta["stream/down"].value == 0

    alive_run, dead_run = str(uuid.uuid4()), str(uuid.uuid4())
    _shard_row(conn, 0, 2, alive_run, beat_s_ago=0.5, lag=1.25, backlog=3, commit_s_ago=2)
    _shard_row(conn, 1, 2, dead_run, beat_s_ago=90, lag=4, backlog=7, commit_s_ago=95)
    on = settings.replace(stream={"enabled": True, "shards": 2, "down_seconds": 30})
    sent: list[int] = []
    real = psycopg.Cursor.execute
    with monkeypatch.context() as m:  # statements sent: the shards are one, whatever their count
        m.setattr(psycopg.Cursor, "execute", lambda cur, *a, **kw: sent.append(1) or real(cur, *a, **kw))
        ov = compute_overview(conn, on)
        two = len(sent)
        compute_overview(conn, settings.replace(stream={"enabled": True, "shards": 64}))
        assert len(sent) - two == two
        shard_status(conn, on.stream)
        assert len(sent) - 2 * two == 1
    live, down = ov.stream["shards"]
    assert (live["run_id"], live["alive"], live["down_s"], live["lag_s"], live["backlog"]) == (
        alive_run,
        True,
        None,
        1.2,
        3,
    )
    assert live["heartbeat_age_s"] < 5 and 1 < live["last_commit_age_s"] < 10
    assert (down["run_id"], down["alive"], down["backlog"]) == (dead_run, False, 7)
    assert 89 < down["down_s"] < 100 and 94 < down["last_commit_age_s"] < 105

    text = "\n".join(text_lines(ov))
    assert "mirror stream: 2 shard(s), 1 alive, 1 DOWN (DOWN: no heartbeat for 30 s;" in text
    assert f"  shard 0 of 2: alive, run {alive_run}, heartbeat " in text
    assert "lag 1.2 s (3 waiting), last commit " in text
    assert "  shard 1 of 2: DOWN for 9" in text and f"s (its run stopped beating), run {dead_run}" in text

    meta = overview_metadata(ov)
    md = meta["mirror_stream"].value
    assert md.startswith("**2 shard(s): 1 alive, 1 DOWN** (no heartbeat for 30 s: ")
    assert len(md) < MD_INLINE_CHARS  # shown inline on the asset page, not behind "[Show Markdown]"
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert rows[0] == "| shard | state | run | heartbeat | lag | backlog | last commit |"
    assert rows[2].startswith(f"| 0 of 2 | alive | [{alive_run[:8]}](/runs/{alive_run}) | ")
    assert " | 1.2 s | 3 | " in rows[2] and rows[2].endswith(" s ago |")
    assert rows[3].startswith("| 1 of 2 | **DOWN for 9") and "(its run stopped beating)** | " in rows[3]
    assert f"[{dead_run[:8]}](/runs/{dead_run})" in rows[3] and " | 4.0 s | 7 | 9" in rows[3]
    assert all(row.count(" | ") == 6 for row in rows)  # every row has the header's seven cells
    assert (meta["stream/shards"].value, meta["stream/alive"].value, meta["stream/down"].value) == (2, 1, 1)
    assert (meta["stream/backlog"].value, meta["stream/max_lag_seconds"].value) == (3, 1.2)  # the live shards'

    # `lakehouse status` prints and returns the same computation
    monkeypatch.setenv("LAKEHOUSE_MIRROR_STREAM", "true")
    monkeypatch.setenv("LAKEHOUSE_MIRROR_SHARDS", "2")
    assert main(["status", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["mirror_stream"]
    assert [s["alive"] for s in got["shards"]] == [True, False] and got["shards"][1]["run_id"] == dead_run
    assert main(["status"]) == 0
    assert "  shard 1 of 2: DOWN for 9" in capsys.readouterr().out

    # many shards: past what the UI shows inline, the DOWN ones are listed and the alive ones counted
    many = {**ov.stream, "shards": [{**live, "shard": i} for i in range(16)] + [{**down, "shard": 16}]}
    md = stream_markdown(many)
    assert len(md) < MD_INLINE_CHARS and md.count("| alive |") == 0 and "| 16 of 17 | **DOWN for 9" in md
    assert md.endswith("16 alive shard(s) not listed: `lakehouse status` lists every shard.")

    # a heartbeat late past the poller's replacement bound, still within the batch fallback's: not plainly "alive"
    late = shard_state({**live, "heartbeat_age_s": 15.0}, 30)
    assert late.startswith("alive, heartbeat late (15 s: the poller replaces a run silent for over 10 s)"), late


def test_the_overview_says_per_dataset_what_holds_it_on_postgres_and_each_compute_readers_consistency(
    conn, dsn, settings, monkeypatch
):
    """Issue 43: per dataset, what keeps it from complete (a pipeline input, a declared reader on Postgres — a compute
    reader with its shadow proof), the counts per holder, and each compute reader's shadow consistency, in the
    overview, its asset and `lakehouse status`; the same holders complete's refusal names. Seen failing on main:
    the overview had no such list (`Overview` has no attribute `held`)."""
    from lakehouse_dagster.flags.reader_datasets import declare
    from lakehouse_dagster.flags.resolver import FlagResolver
    from lakehouse_dagster.routing.exercise import read_through_router
    from lakehouse_dagster.routing.request import parse_query
    from lakehouse_dagster.routing.shadow import ShadowPool
    from lakehouse_dagster.runbooks import complete as cp

    monkeypatch.setenv("LAKEHOUSE_SHADOW_PROOF_READS", "2")  # the asset's settings come from the env
    settings = settings.replace(shadow={"proof_reads": 2})
    ws = datasets.create_workspace(conn, "alpha")
    ds = {name: _dataset(conn, ws, name) for name in ("piped", "dash", "locked", "flipped", "free")}
    for d in ds.values():
        _sync(settings, dsn, d)
    conn.execute(
        "insert into pipelines (workspace_id, name, spec) values (%s, 'nightly', %s)",
        (ws, Jsonb({"nodes": [{"type": "dataset", "data": {"datasetId": str(ds["piped"])}}]})),
    )
    declare(conn, "sdk.files.list", dataset=ds["locked"], actor="pytest")
    declare(conn, "dashboards.aggregate", dataset=ds["dash"], actor="pytest")
    declare(conn, "objects.sync", dataset=ds["flipped"], actor="pytest")
    _set(conn, "read", "objects.sync", "iceberg_only", dataset=ds["flipped"])  # reads Iceberg: holds nothing
    _set(conn, "read", "dashboards.aggregate", "shadow", dataset=ds["dash"])
    pool = ShadowPool(dsn, workers=1, queue_size=16, sample=1.0)
    query = parse_query({"aggregate": {"group_by": ["s"], "measures": [{"fn": "count"}, {"fn": "sum", "column": "n"}]}})
    for _ in range(2):  # two real comparisons: Postgres served, Iceberg computed off the request path
        result, _, _ = read_through_router(
            conn,
            load_catalog(settings, dsn),
            settings,
            "dashboards.aggregate",
            ds["dash"],
            resolver=FlagResolver(conn, ttl_seconds=0),
            shadow_pool=pool,
            query=query,
        )
        assert result.decision.reason == "pg@shadow"
    assert pool.drain(120)

    ov = compute_overview(conn, settings)
    held = {h.name: h for h in ov.held}
    assert list(held) == sorted(held) and set(held) == {"dash", "locked", "piped"}  # not flipped, not free
    assert (held["piped"].pipelines, held["piped"].holders) == (("nightly",), ("pipeline input",))
    assert held["locked"].holders == ("sdk.files.list",) and held["locked"].describe() == "sdk.files.list"
    assert held["dash"].holders == ("dashboards.aggregate",)
    assert held["dash"].describe() == (
        "dashboards.aggregate (mode shadow: on Postgres until flipped, once its shadow reads prove it), shadow: "
        "100.0% consistent over 2 comparison(s), 2 in a row: proven"
    )
    assert ov.held_total == 3
    assert ov.held_by == {
        "pipeline input": 1,
        "sdk.files.list": 1,
        "mediaset.item": 0,
        "objects.sync": 0,
        "dashboards.aggregate": 1,
        "pipeline.expectations": 0,
    }
    shadow = {x.reader: x for x in ov.shadow}
    assert list(shadow) == ["objects.sync", "dashboards.aggregate", "pipeline.expectations"]
    dash = shadow["dashboards.aggregate"]
    assert (dash.datasets, dash.proven, dash.matched, dash.failed, dash.rate) == (1, 1, 2, 0, 100.0)
    assert shadow["objects.sync"].rate is None and shadow["objects.sync"].describe() == (
        "objects.sync: no shadow read compared"
    )
    # complete's refusal names the same holders (runbooks/complete.py's consumer condition)
    for name, words in (("piped", "BLOCKED (pipeline input)"), ("dash", "dashboards.aggregate"), ("locked", "sdk")):
        missing = cp.check(conn, load_catalog(settings, dsn), settings, ds[name]).missing
        assert any(words in m for m in missing), (name, missing)
    assert not any(
        "dataset_rows by" in m or "pipeline input" in m
        for m in cp.check(conn, load_catalog(settings, dsn), settings, ds["flipped"]).missing
    )

    with dg.DagsterInstance.ephemeral() as instance:
        resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
        assert dg.materialize([migration_overview], instance=instance, resources=resources).success
        (record,) = instance.fetch_materializations(MIGRATION_OVERVIEW, limit=1).records
    meta = record.asset_materialization.metadata
    text = meta["held_on_postgres"].value.replace("\\", "")  # as the UI renders it (markdown escapes dropped)
    assert text.startswith("**3 dataset(s) held on Postgres**")
    assert f"- [dash]({partition_page(ds['dash'])}) (mirrored): dashboards.aggregate (mode shadow" in text
    assert "[nightly]" not in text and "pipeline input of nightly" in text
    assert "- dashboards.aggregate: 100.0% consistent over 2 comparison(s) of 1 dataset(s), 1 proven" in text
    assert meta["held_total"].value == 3 and meta["held by pipeline input"].value == 1
    assert meta["held by dashboards.aggregate"].value == 1 and meta["held by objects.sync"].value == 0
    assert meta["shadow dashboards.aggregate: proven"].value == 1
    assert meta["shadow dashboards.aggregate: consistency %"].value == 100.0
    assert "shadow objects.sync: consistency %" not in meta and meta["shadow objects.sync: proven"].value == 0

    proc = cli("status")
    assert proc.returncode == 0, proc.stderr
    assert "held on Postgres (complete refused until they read Iceberg): 3 dataset(s), by pipeline input 1, " in (
        proc.stdout
    )
    assert f"  dash ({ds['dash']}) mirrored: dashboards.aggregate (mode shadow" in proc.stdout
    data = json.loads(cli("status", "--json", check=True).stdout)
    assert data["held_on_postgres"]["total"] == 3 and data["shadow"][1]["reader"] == "dashboards.aggregate"
