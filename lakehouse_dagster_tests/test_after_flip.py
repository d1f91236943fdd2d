"""Gates that hold after the flip (issue 10): the write router refuses a native write for a dataset that
fails the write-flip gates, the native_safety sensor names every such dataset, the read router never
serves Postgres for a native dataset, and flag precedence has one definition that every user agrees with.

Real parts throughout: the real CLI in a subprocess for gated flips, the real write router and chunked
writer into real Iceberg tables, the real mirror and canary, a real Dagster sensor evaluation and run.
"""

from __future__ import annotations

import dagster as dg
import pytest
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.errors import FlipRefused, ReadRefused
from lakehouse_dagster.flags import registry
from lakehouse_dagster.flags.flipped import flipped_dataset_ids
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.flags.stored import resolve_for, stored_overrides
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.lake.reader import load_dataset_table, read_iceberg
from lakehouse_dagster.mirror.reverse import apply_reverse
from lakehouse_dagster.routing.read_router import resolve_read_source
from lakehouse_dagster.tracking import datasets as app_tables

from .flag_helpers import cli, refusal
from .native_helpers import SCHEMA, SERVABLE, native_write, ready_native, row


def _snapshots(settings, dsn, d) -> int | None:
    """How many snapshots the dataset's Iceberg table holds (None: no table)."""
    table = load_table_or_none(load_catalog(settings, dsn), table_identifier(settings, d))
    return None if table is None else len(table.metadata.snapshots)


def _pg_rows(conn, d) -> list:
    return conn.execute(
        "select row_index, row_id, data from dataset_rows where dataset_id = %s order by row_index", (d,)
    ).fetchall()


def _refused_write(conn, dsn, settings, d, writer, *, start: int = 0) -> str:
    """A native write that must be refused with nothing written anywhere; returns the refusal."""
    before = (_snapshots(settings, dsn, d), _pg_rows(conn, d))
    with pytest.raises(FlipRefused) as info:
        native_write(conn, dsn, settings, d, writer, [row(i) for i in range(start, start + 3)], start=start)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"refused: {writer} would write")
    assert (_snapshots(settings, dsn, d), _pg_rows(conn, d)) == before  # nothing in Iceberg, nothing in PG
    log = conn.execute(
        "select writer, path, status, error from iceberg_sync_log where dataset_id = %s order by id desc limit 1", (d,)
    ).fetchone()
    assert log == (writer, "native", "failed", message)  # the sync log says refused, and why
    assert conn.execute("select status, error from datasets where id = %s", (d,)).fetchone() == ("errored", message)
    return message


def _row_edit(conn, d) -> None:
    """What the PG-locked row.edit writer does: a point update in dataset_rows (its version moves)."""
    assert (
        conn.execute(
            'update dataset_rows set data = data || \'{"s": "edited"}\'::jsonb where dataset_id = %s and row_index = 0',
            (d,),
        ).rowcount
        == 1
    )


def _add_pipeline(conn, ws, d) -> None:
    conn.execute(
        "insert into pipelines (workspace_id, name, spec) values (%s, 'nightly', %s)",
        (ws, Jsonb({"nodes": [{"type": "dataset", "data": {"datasetId": str(d)}}]})),
    )


def test_a_dataset_added_to_a_native_workspace_is_refused_with_the_reasons(conn, dsn, settings):
    ready = ready_native(conn, dsn, settings, "sync.append")
    ws = app_tables.get_dataset(conn, ready).workspace_id
    # the operator widens the writers to the workspace in the runbook's order (sync.full first; a dataset flip before
    # its workspace), gated: only `ready` is in it
    cli("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(ready), check=True)
    cli("write-flags", "set", "sync.full", "iceberg_native", "--workspace", str(ws), check=True)
    cli("write-flags", "set", "sync.append", "iceberg_native", "--workspace", str(ws), "--note", "fase4 ws", check=True)
    native_write(conn, dsn, settings, ready, "sync.append", [row(i) for i in range(6, 8)], start=6)

    # Later, a dataset with Postgres rows is created in that workspace: covered natively, never judged.
    late = app_tables.create_dataset(conn, ws, "late_orders", SCHEMA)
    app_tables.insert_rows(conn, late, [row(i) for i in range(4)])
    assert native_dataset_ids(conn, [late]) == {late}
    message = _refused_write(conn, dsn, settings, late, "sync.append", start=4)
    assert f"late_orders ({late})" in message
    assert "never mirrored" in message  # its 4 Postgres rows would never reach Iceberg
    assert "readers still on Postgres for it: export.stream (off)" in message
    assert "no parity verdict recorded" in message
    assert f"pin it to Postgres (lakehouse write-flags set sync.append pg --dataset {late})" in message

    # A brand-new EMPTY dataset there: nothing in Postgres to lose or compare, so only what reads it matters.
    empty = app_tables.create_dataset(conn, ws, "fresh_events", SCHEMA)
    message = _refused_write(conn, dsn, settings, empty, "sync.append")
    assert "readers still on Postgres" in message and "never mirrored" not in message and "parity" not in message
    for r in SERVABLE:  # read-flipped (prerequisite #1): now its first native write goes through
        set_override(conn, "read", r, "iceberg", dataset=empty, note="fase1", actor="pytest")
    native_write(conn, dsn, settings, empty, "sync.append", [row(i) for i in range(3)], start=0)
    assert _snapshots(settings, dsn, empty) == 1 and _pg_rows(conn, empty) == []
    assert conn.execute("select status, error, row_count from datasets where id = %s", (empty,)).fetchone() == (
        "ready",
        None,
        3,
    )


def test_a_pipeline_or_a_lowered_reader_on_a_native_dataset_refuses_its_next_native_write(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.append")
    ws = app_tables.get_dataset(conn, d).workspace_id
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 9)], start=6)
    # Postgres is frozen for a native dataset: a row.edit (PG-locked writer) moves its version, which must not
    # block native writes (Iceberg is the truth; "behind Postgres" and parity at its version mean nothing).
    _row_edit(conn, d)
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(9, 11)], start=9)

    _add_pipeline(conn, ws, d)  # a pipeline starts reading it as input from dataset_rows (F3)
    native_write(conn, dsn, settings, d, "sync.append", [row(11)], start=11)  # the reverse on keeps dataset_rows
    set_reverse(conn, False, dataset=d, note="reverse off", actor="pytest")  # now dataset_rows would go stale
    message = _refused_write(conn, dsn, settings, d, "sync.append", start=12)
    assert "BLOCKED (pipeline input; reverse mirror off)" in message and f"orders ({d})" in message
    assert "behind Postgres" not in message and "parity" not in message  # at-flip reasons do not apply
    conn.execute("delete from pipelines")
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(12, 13)], start=12)

    # a reader lowered by hand (set_override is ungated)
    set_override(conn, "read", "graph.kuzu", "off", dataset=d, note="by hand", actor="pytest")
    message = _refused_write(conn, dsn, settings, d, "sync.append", start=13)
    assert "readers still on Postgres for it: graph.kuzu (off)" in message


def _tick(dsn, cursor=None):
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource
    from lakehouse_dagster.dagster.defs.runbooks.native_safety import native_safety

    with dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(), cursor=cursor, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}
    ) as context:
        result = native_safety(context)
        return result, context.cursor


def test_the_native_safety_sensor_names_every_unsafe_dataset(conn, dsn, settings):
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource
    from lakehouse_dagster.dagster.defs.runbooks.native_safety import native_safety_report

    result, _ = _tick(dsn)
    assert isinstance(result, dg.SkipReason) and result.skip_message == "no dataset is written iceberg-native"
    piped = ready_native(conn, dsn, settings, "sync.full")
    ws = app_tables.get_dataset(conn, piped).workspace_id
    native_write(conn, dsn, settings, piped, "sync.full", [row(i) for i in range(3)], start=0)
    result, _ = _tick(dsn)
    assert isinstance(result, dg.SkipReason) and "all 1 dataset(s) written iceberg-native pass" in result.skip_message

    _add_pipeline(conn, ws, piped)
    set_reverse(conn, False, dataset=piped, note="reverse off: the pipeline input blocks", actor="pytest")
    set_override(conn, "write", "cdc.append", "iceberg_native", workspace=ws, note="by hand", actor="pytest")
    moved = app_tables.create_dataset(conn, app_tables.create_workspace(conn, "other"), "moved_in", SCHEMA)
    app_tables.insert_rows(conn, moved, [row(i) for i in range(2)])
    conn.execute("update datasets set workspace_id = %s where id = %s", (ws, moved))  # a dataset moved in

    result, cursor = _tick(dsn)
    assert isinstance(result, dg.RunRequest) and result.tags["lakehouse/unsafe"] == "2"
    again, _ = _tick(dsn, cursor)  # the same datasets, already reported: named in the tick, no second run
    assert isinstance(again, dg.SkipReason)
    text = again.skip_message
    assert text.startswith("2 of 2 dataset(s) written iceberg-native fail the write-flip gates")
    assert f"orders ({piped}): BLOCKED (pipeline input; reverse mirror off)" in text
    assert f"moved_in ({moved}): never mirrored" in text and "readers still on Postgres" in text

    # The report run the sensor asks for: a real Dagster run that fails, naming them.
    instance = dg.DagsterInstance.ephemeral()
    run = native_safety_report.execute_in_process(
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}, raise_on_error=False, instance=instance
    )
    assert not run.success
    failure = next(e for e in run.all_events if e.event_type_value == "STEP_FAILURE")
    reason = refusal(failure)  # the reason, no stack (dagster/defs/shared/refusals.py)
    assert reason.startswith("2 of 2 dataset(s)") and f"moved_in ({moved})" in reason
    logged = "\n".join(e.user_message for e in instance.all_logs(run.run_id))
    assert "| orders |" in logged and "| moved_in |" in logged  # the table, in the run's log

    # Fixed (pipeline gone, the moved dataset pinned to pg): the sensor says so.
    conn.execute("delete from pipelines")
    set_override(conn, "write", "cdc.append", "pg", dataset=moved, note="keep on pg", actor="pytest")
    result, cursor = _tick(dsn, cursor)
    assert isinstance(result, dg.SkipReason) and "all 1 dataset(s) written iceberg-native pass" in result.skip_message


def test_a_native_dataset_is_never_routed_to_postgres_by_any_reader_mode(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.full")
    # the reverse mirror off: nothing keeps dataset_rows (with it on: the test after this one)
    set_reverse(conn, False, dataset=d, note="Postgres left stale", actor="pytest")
    native_write(conn, dsn, settings, d, "sync.full", [row(i) for i in range(50, 53)], start=0)
    catalog = load_catalog(settings, dsn)
    native_rows = read_iceberg(
        load_dataset_table(catalog, settings, d), ["a"], limit=None, order_by_row_index=True
    ).to_pylist()
    assert native_rows == [{"a": 50}, {"a": 51}, {"a": 52}]
    # Postgres moves on by itself: a row.edit and a schema change bump its version (Iceberg does not follow).
    _row_edit(conn, d)
    app_tables.set_schema(conn, d, SCHEMA + [{"name": "extra", "type": "string"}])
    served = []
    for reader in registry.READERS.values():
        for mode in registry.READ_MODES:  # hand-written rows: any mode, even above the ceiling or below iceberg
            conn.execute("delete from lakehouse_flag_overrides where kind = 'read' and name = %s", (reader.name,))
            conn.execute(
                "insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, set_by)"
                " values ('read', %s, 'dataset', %s, %s, 'psql')",
                (reader.name, d, mode),
            )
            source = resolve_read_source(conn, FlagResolver(conn, 0), reader.name, d)

            def pg(_decision):
                raise AssertionError(f"{reader.name} at {mode} served Postgres for a native dataset")

            def iceberg(decision):
                table = load_dataset_table(catalog, settings, d)
                return read_iceberg(table, ["a"], limit=None, order_by_row_index=True, snapshot_id=decision.snapshot_id)

            if registry.rank("read", reader.ceiling) < registry.rank("read", "iceberg"):
                with pytest.raises(ReadRefused, match="cannot be served by Iceberg"):
                    source.run(postgres=pg, iceberg=iceberg)
                continue
            result = source.run(postgres=pg, iceberg=iceberg)
            assert result.value.to_pylist() == native_rows
            served.append((reader.name, mode, result.decision.reason))
    assert ("studio.preview", "iceberg", "iceberg@native") in served  # STRICT: "lagging" means nothing here
    assert ("export.stream", "off", "iceberg@native") in served and ("graph.kuzu", "shadow", "iceberg@native") in served
    assert ("export.stream", "iceberg", "iceberg@eventual") in served


def test_a_postgres_locked_reader_of_a_native_dataset_reads_the_reverse_mirrors_copy(conn, dsn, settings):
    """The gates let a dataset a Postgres-locked reader reads go native only with its reverse on; the router then
    serves that reader dataset_rows (EVENTUAL: the copy as it is; STRICT: only once caught up), never a stale one."""
    d = ready_native(conn, dsn, settings, "sync.full")
    native_write(conn, dsn, settings, d, "sync.full", [row(i) for i in range(50, 53)], start=0)

    def pg(_decision):
        return [r[0] for r in conn.execute("select data->>'a' from dataset_rows where dataset_id = %s", (d,))]

    def iceberg(_decision):
        raise AssertionError("a Postgres-locked reader was served Iceberg")

    def read(reader):
        return resolve_read_source(conn, FlagResolver(conn, 0), reader, d).run(postgres=pg, iceberg=iceberg)

    # EVENTUAL: the reverse's copy even while it is behind (it holds the pre-native rows: a whole snapshot)
    eventual = read("dashboards.aggregate")
    assert (eventual.decision.source, eventual.decision.reason) == ("pg", "pg@reverse")
    assert sorted(eventual.value) == [str(i) for i in range(6)]
    # STRICT: refused while the reverse has not applied the native commit, with the command that catches it up
    with pytest.raises(ReadRefused) as behind:
        read("pipeline.expectations")
    assert "pipeline.expectations is STRICT and the reverse mirror has not applied its latest snapshot" in str(
        behind.value
    )
    assert f"lakehouse reverse sync --dataset {d}" in str(behind.value)
    apply_reverse(dsn, load_catalog(settings, dsn), settings, d)
    for reader in ("pipeline.expectations", "dashboards.aggregate"):
        got = read(reader)
        assert (got.decision.reason, sorted(got.value)) == ("pg@reverse", ["50", "51", "52"])
    # the reverse turned off: Postgres is stale from the next native commit on, so a reader Iceberg cannot serve is
    # refused; a compute reader not flipped yet (issue 43) is served the latest snapshot: Iceberg is the truth
    set_reverse(conn, False, dataset=d, note="stop the copy", actor="pytest")
    with pytest.raises(ReadRefused) as off:
        read("sdk.files.list")
    assert f"turn its reverse mirror on (lakehouse reverse on --dataset {d})" in str(off.value)
    decision = resolve_read_source(conn, FlagResolver(conn, 0), "dashboards.aggregate", d).decision
    assert (decision.mode, decision.source, decision.reason) == ("off", "iceberg", "iceberg@native")

    # A dataset covered natively with no snapshot at all: refused with the reason, through the real CLI too.
    empty = app_tables.create_dataset(conn, app_tables.get_dataset(conn, d).workspace_id, "no_snapshot_yet", SCHEMA)
    set_override(conn, "write", "sync.full", "iceberg_native", dataset=empty, actor="pytest")
    proc = cli("read", "--reader", "export.stream", "--dataset", str(empty))
    assert proc.returncode == 6 and proc.stdout == ""
    assert "is written iceberg-native: Postgres is stale for it, and Iceberg has no snapshot of it yet" in proc.stderr


# --- precedence: one definition, every user agrees --------------------------------------------------------------


def test_flag_precedence_is_the_same_for_every_user(conn):
    w1, w2 = app_tables.create_workspace(conn, "w1"), app_tables.create_workspace(conn, "w2")
    d1, d2, d3 = (app_tables.create_dataset(conn, w, n, SCHEMA) for w, n in ((w1, "d1"), (w1, "d2"), (w2, "d3")))
    orphan = app_tables.create_dataset(conn, None, "orphan", SCHEMA)  # no workspace: only global overrides reach it
    manifest = app_tables.create_dataset(conn, w2, "files", [], kind="manifest")

    def put(kind, name, scope, scope_id, mode):  # hand-written, like psql: may exceed a ceiling
        conn.execute(
            "insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, set_by)"
            " values (%s, %s, %s, %s, %s, 'psql')",
            (kind, name, scope, scope_id, mode),
        )

    put("read", "export.stream", "global", None, "iceberg")
    put("read", "export.stream", "workspace", w1, "off")  # workspace beats global ...
    put("read", "export.stream", "dataset", d1, "iceberg_only")  # ... dataset beats workspace
    put("read", "studio.digest", "global", None, "iceberg_only")  # above its ceiling (iceberg): clamped
    put("read", "dashboards.aggregate", "dataset", d2, "iceberg_only")  # above its ceiling (iceberg): clamped
    put("read", "sdk.files.list", "dataset", d2, "iceberg")  # ceiling off: clamped to the default
    put("write", "row.edit", "workspace", w1, "iceberg_native")  # PG-locked writer: clamped to pg
    put("write", "sync.full", "global", None, "iceberg_native")
    put("write", "sync.full", "workspace", w2, "pg")  # a workspace pinned back
    put("write", "sync.append", "dataset", d3, "iceberg_native")  # ... and one dataset of it flipped anyway
    put("write", "cdc.append", "workspace", w1, "iceberg_native")
    put("write", "cdc.append", "dataset", d2, "pg")

    resolver = FlagResolver(conn, 0)
    datasets = {d1: w1, d2: w1, d3: w2, orphan: None, manifest: w2}
    flags = [f for fs in registry.REGISTRY.values() for f in fs.values()]
    python = {}
    for f in flags:
        stored = stored_overrides(conn, f.kind, [f.name])[f.name]
        for d, w in datasets.items():
            mode = resolver.resolve(f.kind, f.name, d).mode
            assert mode == resolve_for(f, stored, d, w), (f.name, d)  # the gates' in-memory twin agrees
            python[(d, f.kind, f.name)] = mode

    # The spec, case by case (what the runbooks say precedence and the ceiling mean).
    assert [python[(d, "read", "export.stream")] for d in (d1, d2, d3, orphan)] == [
        "iceberg_only",
        "off",
        "iceberg",
        "iceberg",
    ]
    assert {python[(d, "read", "studio.digest")] for d in datasets} == {"iceberg"}
    assert resolver.resolve("read", "studio.digest", d1).reason == "clamped to ceiling"
    assert python[(d2, "read", "dashboards.aggregate")] == "iceberg"
    assert python[(d2, "read", "sdk.files.list")] == "off"
    assert {python[(d, "write", "row.edit")] for d in datasets} == {"pg"}
    assert [python[(d, "write", "sync.full")] for d in (d1, d2, d3, orphan)] == ["iceberg_native"] * 2 + [
        "pg",
        "iceberg_native",
    ]
    assert python[(d3, "write", "sync.append")] == "iceberg_native"
    assert [python[(d, "write", "cdc.append")] for d in (d1, d2)] == ["iceberg_native", "pg"]
    assert resolver.resolve("read", "export.stream", None).mode == "iceberg"  # no dataset: global only

    # The SQL users: which datasets are native (mirror poller), which are flipped (canary schedule: tabular).
    native = {
        d for d in datasets if any(python[(d, "write", w.name)] == "iceberg_native" for w in registry.FLIPPABLE_WRITERS)
    }
    assert native == {d1, d2, orphan, d3}  # d3: its own sync.append; d2: cdc.append pinned, sync.full global
    assert native_dataset_ids(conn) == native
    assert native_dataset_ids(conn, [d3, manifest]) == {d3}

    def flipped():
        return {
            d
            for d in datasets
            if d != manifest
            and any(
                registry.rank(f.kind, resolver.resolve(f.kind, f.name, d).mode) > registry.rank(f.kind, f.default)
                for f in flags
            )
        }

    assert flipped_dataset_ids(conn) == flipped() == {d1, d2, d3, orphan}
    # Only clamped rows left: a hand-written mode above the ceiling never makes a dataset look flipped.
    conn.execute(
        "delete from lakehouse_flag_overrides where name <> all(%s)",
        (["studio.digest", "sdk.files.list", "row.edit"],),
    )
    conn.execute("delete from lakehouse_flag_overrides where name = 'studio.digest'")
    assert flipped_dataset_ids(conn) == flipped() == set()
    put("read", "studio.digest", "dataset", d2, "iceberg_only")  # clamped to iceberg: above off, so flipped
    assert flipped_dataset_ids(conn) == flipped() == {d2}
