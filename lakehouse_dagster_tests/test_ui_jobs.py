"""Issue 44 item 2: a job launched from the UI runs its steps in its own run process (no step process that imports
the code location again), and its launchpad names readers and writers as everything else does (`sync.full`).
The time a refused runbook job takes from the UI against the CLI is measured in test_e2e.py (the real stack)."""

from __future__ import annotations

import dagster as dg
import pytest

from lakehouse_dagster.dagster.definitions import build
from lakehouse_dagster.flags.registry import FLIPPABLE_WRITERS, PROVEN_READERS, READERS, SERVABLE_READERS
from lakehouse_dagster.sources.writers import WRITERS as SOURCE_WRITERS


@pytest.fixture(scope="module")
def defs() -> dg.Definitions:
    return build()


def test_every_job_runs_its_steps_in_the_run_process(defs):
    """The multiprocess executor starts a process per step, each importing the code location again (~5 s each on
    two cores): a four-step runbook job took 24 s to be refused from the UI where the CLI took 4 s."""
    jobs = list(defs.resolve_all_job_defs())
    assert {j.name for j in jobs} >= {"read_flip", "write_flip", "set_flag", "write_rollback", "complete", "canary"}
    multi = sorted(j.name for j in jobs if j.executor_def.name != dg.in_process_executor.name)
    assert not multi, f"jobs with a step process per step: {multi}"


def _enum_values(job: dg.JobDefinition, op: str, field: str) -> set[str]:
    config = job.graph.node_named(op).definition.config_schema.config_type
    kind = config.fields[field].config_type
    kind = getattr(kind, "inner_type", kind)  # Optional[...] is a Noneable around the enum
    return {v.config_value for v in kind.enum_values}


def test_the_launchpad_names_readers_and_writers_as_the_cli_does(defs):
    """`writer: sync.full`, `reader: export.stream`: the names of the registry, the CLI, the docs and the logs."""
    named = {
        ("write_flip", "write_flip_preflight", "writer"): {w.name for w in FLIPPABLE_WRITERS},
        ("write_rollback", "write_rollback_op", "writer"): {w.name for w in FLIPPABLE_WRITERS},
        ("write_flip_candidates", "write_flip_candidates_op", "writer"): {w.name for w in FLIPPABLE_WRITERS},
        ("read_flip", "read_flip_preflight", "reader"): {r.name for r in (*SERVABLE_READERS, *PROVEN_READERS)},
        ("read", "read_op", "reader"): set(READERS),
        ("ingest_job", "ingest_op", "writer"): set(SOURCE_WRITERS),
    }
    for (job, op, field), want in named.items():
        got = _enum_values(defs.resolve_job_def(job), op, field)
        assert got == want, (job, field, sorted(got))
    assert "sync.full" in _enum_values(defs.resolve_job_def("write_flip"), "write_flip_preflight", "writer")


def test_materialize_all_on_a_caught_up_dataset_is_a_noop_that_says_so(conn, dsn, settings):
    """The lineage page's "Materialize all…" launches, per dataset partition, postgres/dataset_rows then
    iceberg/dataset_table in mode auto: on a dataset Iceberg already holds at Postgres' version it reads no row and
    commits nothing, and its materialization says `noop` (docs/operator-guide.md: only `mode: full`, typed in the
    launchpad, re-mirrors a whole dataset). (Passes on main too: the cost an operator saw was a process per step.)"""
    from lakehouse_dagster.dagster.defs.mirror.assets import iceberg_dataset_table, pg_dataset_rows
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource
    from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
    from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
    from lakehouse_dagster.tracking import datasets

    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "big", [{"name": "n", "type": "int64"}])
    datasets.insert_rows(conn, d, [{"n": k} for k in range(50)])
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])

        def materialize_all() -> dict:
            result = dg.materialize(
                [pg_dataset_rows, iceberg_dataset_table],
                partition_key=str(d),
                resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
                instance=instance,
            )
            assert result.success
            return result.asset_materializations_for_node("iceberg__dataset_table")[0].metadata

        first = materialize_all()
        assert (first["mode"].value, first["rows"].value) == ("full", 50)
        snapshot = load_catalog(settings, dsn).load_table(table_identifier(settings, d)).current_snapshot().snapshot_id
        again = materialize_all()
    assert (again["mode"].value, again["rows"].value, again["bytes_written"].value) == ("noop", 0, 0)
    assert again["reason"].value == "already mirrored at this source version"
    assert again["snapshot_id"].value == str(snapshot)
    table = load_catalog(settings, dsn).load_table(table_identifier(settings, d))
    assert table.current_snapshot().snapshot_id == snapshot  # nothing committed


def _stale(instance: dg.DagsterInstance, asset_graph, partition: str) -> list[str]:
    """What the UI's "Unsynced (n)" badge of an iceberg/dataset_table partition lists (its stale causes, computed as
    the webserver computes them)."""
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
    from dagster._core.definitions.data_version import CachingStaleStatusResolver
    from dagster._time import get_current_datetime

    from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE

    view = AssetGraphView(
        temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
        instance=instance,
        asset_graph=asset_graph,
    )
    resolver = CachingStaleStatusResolver(instance=instance, asset_graph=asset_graph, loading_context=view)
    return [c.reason for c in resolver.get_stale_causes(ICEBERG_TABLE, partition)]


def test_a_partition_is_unsynced_only_while_iceberg_is_behind_whatever_order_the_events_come_in(
    conn, dsn, settings, defs
):
    """Issue 44: crm_accounts showed "Unsynced (1)" while in sync. The ingest op records its postgres/dataset_rows
    materialization after its COPY commits; the stream had mirrored that version and recorded it a moment before, so
    Dagster, comparing timestamps, saw a newer input than the table. With the table's provenance it compares data
    versions: in sync whatever the order, Unsynced once Postgres really moved on, in sync again after the mirror."""
    from lakehouse_dagster.dagster.defs.mirror.mirror_batch import mirror_batch_job
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource
    from lakehouse_dagster.dagster.defs.shared.keys import PG_ROWS
    from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
    from lakehouse_dagster.tracking import datasets

    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "crm_accounts", [{"name": "n", "type": "int64"}])
    datasets.insert_rows(conn, d, [{"n": k} for k in range(5)])
    graph = defs.resolve_asset_graph()
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])

        def mirror() -> None:
            run = mirror_batch_job.execute_in_process(
                run_config={"ops": {"mirror_datasets": {"config": {"datasets": [str(d)]}}}},
                resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
                instance=instance,
                raise_on_error=False,
            )
            assert run.success

        def postgres_recorded(version: int) -> None:  # the ingest op's, the poller's or a reverse apply's record
            instance.report_runless_asset_event(
                dg.AssetMaterialization(PG_ROWS, partition=str(d), tags={"dagster/data_version": str(version)})
            )

        def version() -> int:
            return datasets.get_dataset(conn, d).rows_version

        mirror()
        assert _stale(instance, graph, str(d)) == []
        postgres_recorded(version())  # the same version, recorded after the table's materialization
        assert _stale(instance, graph, str(d)) == [], "in sync, yet Unsynced"
        datasets.insert_rows(conn, d, [{"n": 5}], start_index=5)
        postgres_recorded(version())  # Postgres moved on: the mirror poller records it
        (cause,) = _stale(instance, graph, str(d))
        assert cause.startswith("has a new dependency")
        mirror()
        assert _stale(instance, graph, str(d)) == []
