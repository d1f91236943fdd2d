"""Messages that are true (issue 22): a flip over a scope counts and names what it moves, pins and leaves out; the
global step of the runbook after a workspace flip goes through; the soak is one stored setting the CLI and a Dagster
run read the same way, and 0 keeps the runbooks' order; `lakehouse read` prints one router line; the smoke check of
a dataset written natively by sync.full compares its content. Every command through the CLI's own ``main``."""

from __future__ import annotations

import shlex
import subprocess
import sys
import uuid

import dagster as dg
import pytest

from lakehouse_dagster.cli.main import main
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.runbooks.rollout import read_flip_job
from lakehouse_dagster.flags.overrides import list_overrides, set_override
from lakehouse_dagster.flags.reverse_setting import set_reverse, where_native_writes_land
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.tracking import datasets

from .flag_helpers import flag_tables, refusal
from .native_helpers import SCHEMA, runbook_ready
from .test_write_flip_first_sync import _fed


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def ws(conn):
    return datasets.create_workspace(conn, "sales")


def _synced(conn, dsn, settings, ws, name: str, rows: int = 3) -> uuid.UUID:
    d = datasets.create_dataset(conn, ws, name, [{"name": "n", "type": "int64"}])
    datasets.insert_rows(conn, d, [{"n": i} for i in range(rows)])
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d, mode="full")
    return d


# --- the global step after the workspace flip; the order with a soak of 0 ---------------------------------------


def test_the_global_read_flip_after_its_workspace_goes_through_and_says_it_moves_nothing_now(
    conn, dsn, settings, ws, capsys
):
    a, b = _synced(conn, dsn, settings, ws, "a"), _synced(conn, dsn, settings, ws, "b")
    files = datasets.create_dataset(conn, ws, "images", [], kind="manifest")
    # soak 0 (the tests' LAKEHOUSE_SOAK_SECONDS), and still the order: no global flip before a workspace flip
    before = flag_tables(conn)
    code, _, err = _cli(capsys, "flags", "flip", "graph.kuzu", "iceberg_only")
    assert code == 6 and flag_tables(conn) == before
    assert "order (dataset → workspace → global): no workspace-scope flip of graph.kuzu to iceberg_only" in err
    assert "the soak is 0 s, which drops the waiting, not the order" in err
    assert _cli(capsys, "flags", "flip", "export.stream", "--dataset", str(a))[0] == 0
    code, out, _ = _cli(capsys, "flags", "flip", "export.stream", "--workspace", str(ws))
    assert code == 0
    assert (
        f"moves 1 of 3 dataset(s) in workspace sales ({ws}) to iceberg; 1 already at iceberg or above; 1 manifest "
        "dataset(s) not Iceberg-tabular; the workspace override decides for datasets created in it later"
    ) in out
    assert f"  moves: b ({b}): off → iceberg" in out
    assert f"  already: a ({a}): iceberg, by its dataset override" in out

    # the runbook's step 4, global: every dataset of this one-workspace install already resolves iceberg, and the
    # global flip is still the step to take (it decides for workspaces and datasets created later): written, exit 0
    code, out, err = _cli(capsys, "flags", "flip", "export.stream", "--note", "fase1 global")
    assert code == 0, err
    assert "moves 0 of 3 dataset(s) in global to iceberg; 3 already at iceberg or above" in out
    assert "the global override decides for datasets created later" in out
    assert ("global", "iceberg") in {(o.scope, o.mode) for o in list_overrides(conn, "read")}
    assert str(files) in out and "images" in out  # the manifest dataset is named too

    # again: now truly nothing to do, and the one plain line says why (not an error: exit 0, issue 44)
    code, out, err = _cli(capsys, "flags", "flip", "export.stream")
    assert code == 0 and err == ""
    assert out.startswith("nothing to flip: of the 3 dataset(s) in global, 3 already resolve export.stream to iceberg")
    assert "and global itself already resolves it to iceberg" in out and len(out.splitlines()) == 1


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_the_readmes_flip_loop_carries_on_past_a_reader_with_nothing_to_flip(conn, dsn, settings, ws):
    """README's `for r in …; do lakehouse flags flip $r --dataset $CRM; done` under `set -e`: a reader already on
    Iceberg says "nothing to flip" and the loop goes on to the next (it stopped there, exit 2, before issue 44)."""
    d = _synced(conn, dsn, settings, ws, "crm")
    for r in ("export.stream", "graph.kuzu"):
        set_override(conn, "read", r, "iceberg", dataset=d, actor="pytest")
    lakehouse = f"{shlex.quote(sys.executable)} -m lakehouse_dagster.cli.main"
    script = f"set -e; for r in export.stream graph.kuzu; do {lakehouse} flags flip $r --dataset {d}; done; echo done"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["nothing to flip", "nothing to flip", "done"], lines
    assert "graph.kuzu" in lines[1] and "error" not in proc.stdout + proc.stderr


def test_a_workspace_flip_with_every_dataset_pinned_or_already_there_opens_with_a_sentence(
    conn, dsn, settings, ws, capsys
):
    """The preflight canaries nothing when the flip moves no dataset: it says so, not a bare "(none)"."""
    a, b = _synced(conn, dsn, settings, ws, "a"), _synced(conn, dsn, settings, ws, "b")
    set_override(conn, "read", "export.stream", "iceberg", dataset=a, actor="pytest")  # already
    set_override(conn, "read", "export.stream", "off", dataset=b, actor="pytest")  # pinned below it
    code, out, err = _cli(capsys, "flags", "flip", "export.stream", "--workspace", str(ws), "--note", "ws")
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0] == "preflight canary: no dataset to check, the flip moves none", lines
    assert "(none)" not in lines and lines[1].startswith("preflight covered 0 of 0 moved dataset(s)")
    assert f"  pinned: b ({b}): off, by its dataset override" in lines


def test_a_read_flips_preflight_counts_no_manifest_dataset_as_moved(conn, dsn, settings, ws, capsys):
    """A manifest dataset stays on Postgres whatever a read flag says, and the scope report says so once ("not
    applicable"): the preflight neither counts it among the moved datasets nor names it again (issue 44)."""
    a, b, c = (_synced(conn, dsn, settings, ws, name) for name in "abc")
    files = datasets.create_dataset(conn, ws, "images", [], kind="manifest")
    set_override(conn, "read", "export.stream", "off", dataset=a, actor="pytest")  # pinned below the flip
    set_override(conn, "read", "export.stream", "iceberg", dataset=b, actor="pytest")  # the narrower flip, first
    code, out, err = _cli(capsys, "flags", "flip", "export.stream", "--workspace", str(ws), "--note", "ws")
    assert code == 0, out + err
    lines = out.splitlines()
    coverage = next(line for line in lines if line.startswith("preflight covered"))
    assert coverage.startswith("preflight covered 1 of 1 moved dataset(s)") and "skipped" not in coverage, lines
    assert [line for line in lines if str(files) in line] == [
        f"  not applicable: images ({files}): a manifest dataset, not Iceberg-tabular: the read router keeps serving "
        "it from Postgres"
    ], lines
    assert any(line.startswith("moves 1 of 4 dataset(s)") for line in lines), lines
    assert f"  moves: c ({c}): off → iceberg" in lines


def test_the_write_flips_line_says_where_new_writes_land_as_the_reverse_setting_says(conn, ws):
    on, off, also_off = (datasets.create_dataset(conn, ws, n, SCHEMA) for n in ("on", "off", "also_off"))
    for d in (off, also_off):
        set_reverse(conn, False, dataset=d, actor="pytest", note="test")
    both = where_native_writes_land(conn, [on])  # the default: on
    assert "land in Iceberg, the mirror skips them; the reverse mirror copies them back into dataset_rows" in both
    assert "Iceberg only" not in both
    assert where_native_writes_land(conn, [off, also_off]) == (
        "new writes of the datasets it moves land in Iceberg only, the mirror skips them (reverse mirror off)"
    )
    mixed = where_native_writes_land(conn, [on, off])
    assert "copies them back into dataset_rows, except for 1 of 2 with it off: " + str(off) in mixed


# --- a write flip over a workspace: moved, pinned, already, not applicable ---------------------------------------


def test_a_workspace_write_flip_moves_the_ready_datasets_around_the_pinned_ones_and_names_them(
    conn, dsn, settings, ws, capsys
):
    native, ready = (_synced(conn, dsn, settings, ws, n) for n in ("native", "ready"))
    for d in (native, ready):
        runbook_ready(conn, dsn, settings, d)
    assert _cli(capsys, "write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(native))[0] == 0
    pinned = [datasets.create_dataset(conn, ws, f"unready_{i}", SCHEMA) for i in range(10)]
    for d in pinned:  # not ready (never mirrored): kept on pg by their own override
        set_override(conn, "write", "sync.full", "pg", dataset=d, actor="pytest")
    images = datasets.create_dataset(conn, ws, "images", [], kind="manifest")

    code, out, err = _cli(capsys, "write-flags", "flip", "sync.full", "--workspace", str(ws), "--note", "fase4 ws")
    assert code == 0, out + err
    assert (
        f"moves 1 of 13 dataset(s) in workspace sales ({ws}) to iceberg_native; 10 pinned below it by a narrower "
        "override; 1 already at iceberg_native or above; 1 manifest dataset(s) outside a write flip"
    ) in out
    assert f"  moves: ready ({ready}): pg → iceberg_native" in out
    assert f"  pinned: unready_0 ({pinned[0]}): pg, by its dataset override" in out
    assert f"  already: native ({native}): iceberg_native, by its dataset override" in out
    na = next(line for line in out.splitlines() if "not applicable" in line)
    assert f"images ({images})" in na and "write flips do not apply" in na
    assert "lakehouse sync" not in na and "lakehouse canary" not in na  # no advice that refuses
    assert "nothing to flip" not in out + err
    modes = {(o.scope, o.scope_id): o.mode for o in list_overrides(conn, "write")}
    assert modes[("workspace", ws)] == "iceberg_native" and modes[("dataset", pinned[0])] == "pg"
    # the reverse mirror is on by default: the moved dataset's new writes come back into dataset_rows (issue 44)
    assert "the reverse mirror copies them back into dataset_rows" in out and "Iceberg only" not in out

    # a manifest dataset named alone: refused in one line, with no advice to sync or canary it
    code, _, err = _cli(capsys, "write-flags", "flip", "sync.full", "--dataset", str(images))
    assert code == 2 and "write flips do not apply" in err and "lakehouse sync" not in err


# --- the soak: one stored setting for the CLI and every Dagster process --------------------------------------------


def test_the_stored_soak_is_what_the_cli_and_a_dagster_run_apply_whatever_their_environment(
    conn, dsn, settings, ws, capsys, monkeypatch
):
    a = _synced(conn, dsn, settings, ws, "a")
    _synced(conn, dsn, settings, ws, "b")
    code, out, _ = _cli(capsys, "soak", "show")
    assert code == 0 and "soak: 0 s (LAKEHOUSE_SOAK_SECONDS of this process; nothing stored" in out
    set_override(conn, "read", "export.stream", "iceberg", dataset=a, note="fase1 canary", actor="pytest")

    # stored 0 while this process' environment says an hour: the Dagster run widens at once (stored wins)
    monkeypatch.setenv("LAKEHOUSE_SOAK_SECONDS", "3600")
    code, out, _ = _cli(capsys, "soak", "set", "0", "--note", "demo")
    assert code == 0 and "soak: nothing stored → 0 s, stored" in out and "not the order" in out
    assert "LAKEHOUSE_SOAK_SECONDS=3600 in this shell is ignored" in out
    run = read_flip_job.execute_in_process(
        run_config={"ops": {"read_flip_preflight": {"config": {"reader": "export.stream", "workspace_id": str(ws)}}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert run.success
    set_override(conn, "read", "graph.kuzu", "iceberg", dataset=a, note="fase1 canary", actor="pytest")

    # stored an hour while the environment says 0: the CLI and the same job both refuse, naming the dataset flip
    monkeypatch.setenv("LAKEHOUSE_SOAK_SECONDS", "0")
    assert _cli(capsys, "soak", "set", "3600", "--note", "fase1: an hour")[0] == 0
    code, _, err = _cli(capsys, "flags", "set", "graph.kuzu", "iceberg", "--workspace", str(ws))
    assert code == 6 and "soak: the narrower flip has not soaked yet" in err
    assert f"graph.kuzu iceberg at dataset a ({a})" in err and f"(workspace sales ({ws}))" in err
    run = read_flip_job.execute_in_process(
        run_config={"ops": {"read_flip_preflight": {"config": {"reader": "graph.kuzu", "workspace_id": str(ws)}}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not run.success
    (failure,) = run.get_step_failure_events()
    assert "soak: the narrower flip has not soaked yet" in refusal(failure) and f"a ({a})" in refusal(failure)
    code, out, _ = _cli(capsys, "soak", "show")
    assert "soak: 3600 s (stored: set by pytest" in out and "note: fase1: an hour" in out
    assert [line.split()[-1] for line in out.splitlines()[-2:]] == ["hour", "demo"]  # the audit, newest first
    # bad input: one line, nothing stored
    assert _cli(capsys, "soak", "set", "an hour")[0] == 2


# --- one router line per read; the smoke check after a native sync.full ------------------------------------------


def test_lakehouse_read_prints_one_router_line(conn, dsn, settings, ws, capsys):
    d = _synced(conn, dsn, settings, ws, "a")
    set_override(conn, "read", "export.stream", "iceberg", dataset=d, actor="pytest")
    code, out, err = _cli(capsys, "read", "--reader", "export.stream", "--dataset", str(d), "--limit", "1")
    assert code == 0
    assert (out + err).count("[read-router]") == 1 and "reason=iceberg@eventual" in out


def test_the_smoke_check_after_a_native_sync_full_compares_the_content(conn, dsn, settings, capsys):
    d, _ = _fed(conn, dsn, settings)
    code, out, err = _cli(capsys, "write-flags", "flip", "sync.full", "--dataset", str(d))
    assert code == 0, out + err
    # the reverse off: the canary's own native comparison (with it on the canary compares both ways)
    code, out, err = _cli(capsys, "reverse", "off", "--dataset", str(d), "--note", "native smoke")
    assert code == 0, out + err
    code, out, _ = _cli(capsys, "canary", "--smoke", "--dataset", str(d), "--json")
    assert code == 0
    import json

    (r,) = json.loads(out)["results"]
    assert r["verdict"] == "native" and r["smoke"] == "match", r
    assert r["detail"]["agrees_with_postgres"] is True and r["detail"]["identity_assigned_anew"] is True
    reason = r["detail"]["reason"]
    assert "its content matches Postgres (6 rows, content columns)" in reason
    assert "identity columns (__row_id, __created_at, the __row_index order) were assigned anew" in reason
    assert "differs" not in reason
