"""What an operator sees: dataset names on real Dagster runs (tags, metadata), refusals without a stack trace,
the CLI's wording and exit codes, and an interrupted ingest bench that cleans up after itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest

from lakehouse_dagster.dagster.defs.flags.flags import clear_flag_job, set_flag_job
from lakehouse_dagster.dagster.defs.mirror.assets import iceberg_dataset_table, pg_dataset_rows
from lakehouse_dagster.dagster.defs.mirror.sensors import mirror_poller
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared import tags as T
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
from lakehouse_dagster.dagster.defs.sources.ingest import source_poller
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.testing.faults import default_sigint
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli, cli_json, flag_tables, refusal
from .native_helpers import SCHEMA as FED_SCHEMA
from .native_helpers import pg_source_table, row

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture
def world(conn):
    ws = datasets.create_workspace(conn, "sales")
    d = datasets.create_dataset(conn, ws, "orders_2026", SCHEMA)
    datasets.insert_rows(conn, d, [{"n": i, "s": str(i)} for i in range(5)])
    return {"ws": ws, "d": d}


def _resources(dsn):
    return {"lakehouse": LakehouseResource(pg_dsn=dsn)}


def _run(job, dsn, instance, config: dict):
    op_name = next(iter(job.graph.node_dict))
    return job.execute_in_process(
        run_config={"ops": {op_name: {"config": config}}},
        resources=_resources(dsn),
        instance=instance,
        raise_on_error=False,
    )


# --- names on runs, materializations and check results ---------------------------------------------------------


def test_a_mirror_run_carries_the_dataset_name_in_tags_and_metadata_with_ids_as_text(
    conn, dsn, settings, instance, world
):
    d = world["d"]
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    result = dg.materialize(
        [pg_dataset_rows, iceberg_dataset_table], partition_key=str(d), resources=_resources(dsn), instance=instance
    )
    assert result.success
    tags = instance.get_run_by_id(result.run_id).tags
    assert (tags[T.DATASET], tags[T.DATASET_NAME]) == (str(d), "orders_2026")
    (mirror,) = result.asset_materializations_for_node("iceberg__dataset_table")
    meta = mirror.metadata
    assert meta["dataset_name"] == dg.MetadataValue.text("orders_2026")
    assert meta["dataset_id"] == dg.MetadataValue.text(str(d))
    # identifiers and versions are text (Dagster would plot numbers across partitions as one series)
    for key in ("snapshot_id", "source_version"):
        assert isinstance(meta[key], dg.TextMetadataValue), key
    assert isinstance(meta["rows"], dg.IntMetadataValue) and meta["rows"].value == 5
    (rows,) = result.asset_materializations_for_node("postgres__dataset_rows")
    assert rows.metadata["dataset_name"].value == "orders_2026"
    assert isinstance(rows.metadata["rows_version"], dg.TextMetadataValue)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_check_results_name_the_dataset(conn, dsn, settings, instance, world):
    from lakehouse_dagster.dagster.defs.parity.checks import PARITY_CHECKS

    d = world["d"]
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    result = dg.materialize(
        [pg_dataset_rows, iceberg_dataset_table, *PARITY_CHECKS],
        partition_key=str(d),
        resources=_resources(dsn),
        instance=instance,
    )
    evaluations = result.get_asset_check_evaluations()
    assert {e.check_name for e in evaluations} == {"parity", "snapshot_freshness", "identity_ready"}
    for e in evaluations:
        assert e.metadata["dataset_name"].value == "orders_2026", e.check_name
        for key, value in e.metadata.items():
            if key.endswith("_version") or key.endswith("_id"):
                assert isinstance(value, dg.TextMetadataValue), (e.check_name, key)


def test_sensor_run_requests_carry_dataset_tags(conn, dsn, settings, instance, world):
    mirror = mirror_poller(dg.build_sensor_context(instance=instance, resources=_resources(dsn)))
    (req,) = mirror.run_requests
    assert (req.tags[T.DATASET], req.tags[T.DATASET_NAME]) == (str(world["d"]), "orders_2026")

    fed = datasets.create_dataset(conn, world["ws"], "crm feed", FED_SCHEMA)
    set_source(
        conn, fed, {"type": "postgres", "table": pg_source_table(conn, [row(0)]), "cursor_column": "a", "dsn_env": None}
    )
    ingest = source_poller(dg.build_sensor_context(instance=instance, resources=_resources(dsn)))
    (req,) = ingest.run_requests
    assert (req.tags[T.DATASET], req.tags[T.DATASET_NAME], req.tags[T.WRITER]) == (
        str(fed),
        "crm feed",
        "sync.incremental",
    )


def test_a_flag_job_run_is_tagged_from_its_config_even_when_refused(conn, dsn, settings, instance, world):
    ok = _run(
        set_flag_job,
        dsn,
        instance,
        {"kind": "read", "name": "export.stream", "mode": "shadow", "dataset_id": str(world["d"])},
    )
    assert ok.success
    tags = instance.get_run_by_id(ok.run_id).tags
    assert (tags[T.READER], tags[T.SCOPE], tags[T.DATASET], tags[T.DATASET_NAME]) == (
        "export.stream",
        f"dataset:{world['d']}",
        str(world["d"]),
        "orders_2026",
    )
    assert T.WRITER not in tags

    refused = _run(clear_flag_job, dsn, instance, {"kind": "write", "name": "sync.full", "workspace_id": "nope"})
    assert not refused.success
    tags = instance.get_run_by_id(refused.run_id).tags
    assert (tags[T.WRITER], tags[T.SCOPE]) == ("sync.full", "workspace:nope")
    # the runs list filter finds them
    runs = instance.get_run_records(dg.RunsFilter(tags={T.DATASET_NAME: "orders_2026"}))
    assert [r.dagster_run.run_id for r in runs] == [ok.run_id]


# --- refusals: the one-line reason, no stack trace --------------------------------------------------------------


@pytest.mark.parametrize(
    "config,reason",
    [
        ({"kind": "read", "name": "export.stream", "mode": "iceberg_onyl"}, "iceberg_onyl"),
        ({"kind": "read", "name": "export.stream", "mode": "iceberg", "dataset_id": "nope"}, "is not a valid UUID"),
        # a gate: the workspace's dataset was never mirrored (said once: "Refused: set …", not "Refused: refused: …")
        ({"kind": "write", "name": "sync.full", "mode": "iceberg_native", "workspace_id": "{ws}"}, "nothing written"),
    ],
)
def test_a_refusal_fails_the_step_with_the_reason_and_no_stack_trace(
    conn, dsn, settings, instance, world, config, reason
):
    config = {k: v.format(ws=world["ws"]) for k, v in config.items()}
    before = flag_tables(conn)
    result = _run(set_flag_job, dsn, instance, config)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    assert reason in refusal(failure).splitlines()[0]
    if reason != "nothing written":  # bad input: one line; a gate adds a line per blocked dataset
        assert "\n" not in refusal(failure)
    data = failure.step_failure_data
    # what the UI's log row shows (error message, then each cause, each with its stack when it has one) and what
    # the console prints (error_display_string): the reason, and not one stack frame
    run_failure = next(e for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE")
    shown_run = _ui_text(run_failure.event_specific_data.error, None)  # RUN_FAILURE: no error source, every stack
    for shown in (_ui_text(data.error, data.error_source), data.error_display_string, shown_run):
        assert reason in shown and "Refused: " in shown and "Refused: refused" not in shown
        assert "Stack Trace" not in shown and 'File "' not in shown and "Traceback" not in shown, shown
    assert data.error.stack == [] and data.error.cause is None
    assert flag_tables(conn) == before


def _ui_text(error, error_source) -> str:
    """A failure row of the run's log as the Dagster 1.13 UI renders it (ui-core LogsRowStructuredContent,
    FailureContent): the message; the stack unless a USER_CODE_ERROR with a cause; each cause with its stack. The
    RUN_FAILURE row is rendered the same way with no error source."""
    text = error.message
    if error.stack and not (error_source is not None and error_source.value == "USER_CODE_ERROR" and error.cause):
        text += "\nStack Trace:\n" + "".join(error.stack)
    cause = error.cause
    while cause is not None:
        text += "The above exception was caused by the following exception:\n" + cause.message
        if cause.stack:
            text += "\nStack Trace:\n" + "".join(cause.stack)
        cause = cause.cause
    return text


# --- the CLI ----------------------------------------------------------------------------------------------------


def test_clear_names_the_narrower_overrides_that_remain(conn, dsn, settings, world):
    ws2 = datasets.create_workspace(conn, "ops")
    others = [datasets.create_dataset(conn, world["ws"], f"d{i}", SCHEMA) for i in range(2)]
    set_override(conn, "read", "export.stream", "shadow", actor="t")
    set_override(conn, "read", "export.stream", "off", workspace=ws2, actor="t")
    for d in [world["d"], *others]:
        set_override(conn, "read", "export.stream", "shadow", dataset=d, actor="t")
    set_override(conn, "read", "graph.kuzu", "shadow", dataset=world["d"], actor="t")  # another reader: not listed

    proc = cli("flags", "clear", "export.stream")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "1 workspace override(s), 3 dataset override(s) of export.stream remain" in out
    assert f"workspace {ws2} (ops): off" in out
    assert f"dataset {world['d']} (orders_2026): shadow" in out
    assert "graph.kuzu" not in out

    # a workspace clear names only that workspace's dataset overrides; --json lists them too
    set_override(conn, "read", "export.stream", "shadow", workspace=world["ws"], actor="t")
    data = cli_json("flags", "clear", "export.stream", "--workspace", str(world["ws"]))
    assert sorted(r["scope_id"] for r in data["narrower_remaining"]) == sorted(str(d) for d in [world["d"], *others])
    # nothing narrower: nothing said
    assert "remain" not in cli("flags", "clear", "export.stream", "--dataset", str(world["d"])).stdout


def test_write_flags_clear_names_the_remaining_dataset_overrides(conn, dsn, settings, world):
    set_override(conn, "write", "sync.append", "pg", workspace=world["ws"], actor="t")
    set_override(conn, "write", "sync.append", "pg", dataset=world["d"], actor="t")
    proc = cli("write-flags", "clear", "sync.append", "--workspace", str(world["ws"]))
    assert proc.returncode == 0, proc.stderr
    assert "1 dataset override(s) of sync.append remain" in proc.stdout
    assert "lakehouse write-flags clear sync.append --<scope> <id>" in proc.stdout


@pytest.mark.parametrize("verb,name", [("flags", "export.stream"), ("write-flags", "sync.full")])
def test_a_flip_that_moves_no_dataset_writes_nothing_and_says_so_in_one_plain_line(
    conn, dsn, settings, world, verb, name
):
    """Not an error (issue 44): one informational line on stdout and exit 0, so a script's loop carries on."""
    empty = datasets.create_workspace(conn, "empty")
    before = flag_tables(conn)
    proc = cli(verb, "flip", name, "--workspace", str(empty))
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.strip().splitlines()
    assert line.startswith(f"nothing to flip: workspace empty ({empty}) holds no dataset;")
    assert "nothing written" in line and proc.stderr == ""
    assert flag_tables(conn) == before

    if verb == "flags":  # the workspace itself already at the mode, and its one dataset too: nothing moves
        set_override(conn, "read", name, "iceberg", dataset=world["d"], actor="t")
        set_override(conn, "read", name, "iceberg", workspace=world["ws"], actor="t")
        before = flag_tables(conn)
        proc = cli(verb, "flip", name, "--workspace", str(world["ws"]))
        assert proc.returncode == 0, proc.stderr
        assert (
            f"of the 1 dataset(s) in workspace sales ({world['ws']}), 1 already resolve export.stream to iceberg "
            f"or above, and workspace sales ({world['ws']}) itself already resolves it to iceberg"
        ) in proc.stdout
        assert flag_tables(conn) == before


def test_datasets_lists_each_workspace_with_name_and_id(conn, dsn, settings, world):
    ws2 = datasets.create_workspace(conn, "marketing")
    datasets.create_dataset(conn, ws2, "campaigns", SCHEMA)
    proc = cli("datasets")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = lines.index(f"workspace marketing ({ws2}): 1 dataset(s)")
    assert "campaigns" in lines[head + 2]
    sales = lines.index(f"workspace sales ({world['ws']}): 1 dataset(s)")
    assert "orders_2026" in lines[sales + 2] and str(world["d"]) in lines[sales + 2]
    data = cli_json("datasets")
    assert {(r["name"], r["workspace"], r["workspace_id"]) for r in data} == {
        ("campaigns", "marketing", str(ws2)),
        ("orders_2026", "sales", str(world["ws"])),
    }


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_ingest_bench_purges_what_it_made(conn, dsn, settings, sig):
    """The writers freeze before their commit (a failpoint), the parent is interrupted: it stops them and purges
    the bench workspace, datasets, tables and their uncommitted files, then exits 130 without a traceback."""
    env = {**os.environ, "LAKEHOUSE_FAILPOINT": "before-commit:stop"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lakehouse_dagster.cli.main", "ingest-bench", "run", "--jobs", "2", "--rows", "2000"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,  # a suite run in the background (nohup, CI) would hand SIGINT on ignored
    )
    try:
        deadline = time.monotonic() + 180
        while len(_stopped_descendants(proc.pid)) < 2:  # both writers wrote their files and froze
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        frozen = _stopped_descendants(proc.pid)
        warehouse = Path(settings.catalog.warehouse.removeprefix("file://"))
        assert any(p.suffix == ".parquet" for p in warehouse.rglob("*")), "the writers wrote no file before freezing"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "purged namespace bench: 2 table(s), 2 dataset(s), 1 workspace(s)" in err
    assert "interrupted" in err and "Traceback" not in err
    assert conn.execute("select count(*) from workspaces where name like 'lakehouse-ingest-bench%'").fetchone()[0] == 0
    assert conn.execute("select count(*) from datasets").fetchone()[0] == 0
    # nothing is left behind: no table, no namespace, not even an empty warehouse/bench directory
    assert ("bench",) not in load_catalog(settings.replace(catalog={"namespace": "bench"}), dsn).list_namespaces()
    assert list(warehouse.rglob("*")) == []
    assert all(not Path(f"/proc/{pid}").exists() for pid in frozen)


def test_bad_input_to_the_cli_is_one_line_and_no_traceback(conn, dsn, settings, world):
    for args, code in (
        (["ingest-bench", "run", "--jobs", "0"], 2),
        (["sync", "--dataset", "nope"], 2),
        (["flags", "set", "export.stream", "iceberg_onyl"], 2),
        (["read", "--reader", "export.stream", "--dataset", str(uuid.uuid4())], 3),
    ):
        proc = cli(*args)
        assert proc.returncode == code, (args, proc.stderr)
        (line,) = proc.stderr.strip().splitlines()  # (the bench purges nothing it did not make, and says nothing)
        assert line.startswith(f"lakehouse {args[0]}: error: ") and "Traceback" not in proc.stderr


def _stopped_descendants(root: int) -> list[int]:
    """Processes under ``root`` in state T (stopped), from /proc."""
    parent, state = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state[int(entry.name)], parent[int(entry.name)] = fields[0], int(fields[1])
    out = []
    for pid, st in state.items():
        p = pid
        while p in parent and p != root and p > 1:
            p = parent[p]
        if p == root and pid != root and st == "T":
            out.append(pid)
    return out
