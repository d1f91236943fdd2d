"""What `lakehouse up` puts on the console of an idle stack (issue 44, "a calm console"), part by part; the whole
stack idling for two minutes is test_calm_stack.py (slow).

* Dagster's own services run at WARNING unless ``--debug`` (their INFO lines were ~150 of 1,052 in 22 idle minutes);
* what is relayed has no colours (Dagster's services colour their records, its runs and sensors and the API do not);
* a beta warning Dagster's logging captured as a WARNING record (the code server's ``owners`` of SensorDefinition,
  raised by Dagster itself) is dropped with the lines Python prints under it;
* the sensors log an idle tick at DEBUG (kept in the tick's log in the UI, not on the console) and a tick that asks
  for something at INFO.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import dagster as dg
import pytest

from lakehouse_dagster.cli.console import ConsoleFilter, relay
from lakehouse_dagster.cli.up import dagster_dev_cmd
from lakehouse_dagster.dagster.defs.mirror.sensors import mirror_poller
from lakehouse_dagster.dagster.defs.recording.recorder import lakehouse_recorder
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.sources.ingest import source_poller
from lakehouse_dagster.tracking import datasets

# Lines of a real `dagster dev` console (lakehouse up on main 561ebdd), colours and all.
_BETA = (
    "\x1b[32m2026-12-07 05:56:36 +0000\x1b[0m - dagster - \x1b[34mWARNING\x1b[0m - /venv/lib/python3.11/site-packages/"
    "dagster/_core/definitions/sensor_definition.py:809: BetaWarning: Parameter `owners` of initializer "
    "`SensorDefinition.__init__` is currently in beta, and may have breaking changes in minor version releases, with "
    "behavior changes in patch releases.\n"
    "  return SensorDefinition(\n"
    "\n"
)
_SERVICE_WARNING = (
    "\x1b[32m2026-12-07 05:58:10 +0000\x1b[0m - dagster.daemon - \x1b[34mWARNING\x1b[0m - Daemon threads did not "
    "shut down within 30 seconds\n"
)
_RUN_LINE = (
    "2026-12-07 05:57:02 +0000 - dagster - INFO - mirror_stream - 999c9972-52ca-4329-afaa-0d81fb2b39e9 - "
    "stream_shard_op - streaming shard 0 of 1 for 900s\n"
)


def _relayed(text: str, *, debug: bool = False) -> str:
    out = io.StringIO()
    relay(io.StringIO(text), out, ConsoleFilter(debug=debug)).join(10)
    return out.getvalue()


def test_dagster_dev_runs_its_own_services_at_warning_unless_debug():
    cmd = dagster_dev_cmd("127.0.0.1", 3000, Path("workspace.yaml"), debug=False)
    assert cmd[cmd.index("--log-level") + 1] == "warning"
    assert cmd[1:4] == ["-m", "dagster", "dev"] and "workspace.yaml" in cmd
    debug = dagster_dev_cmd("127.0.0.1", 3000, Path("workspace.yaml"), debug=True)
    assert debug[debug.index("--log-level") + 1] == "info"


def test_the_console_is_relayed_in_one_format_without_colours():
    calm = _relayed(_SERVICE_WARNING + _RUN_LINE)
    assert "\x1b[" not in calm
    assert calm == (
        "2026-12-07 05:58:10 +0000 - dagster.daemon - WARNING - Daemon threads did not shut down within 30 seconds\n"
        + _RUN_LINE
    )
    assert "\x1b[" not in _relayed(_SERVICE_WARNING, debug=True)  # --debug: everything, in the same format


def test_a_beta_warning_inside_a_dagster_record_is_dropped_with_its_source_line():
    calm = _relayed(_BETA + _RUN_LINE)
    assert calm == _RUN_LINE, calm
    assert "BetaWarning" in _relayed(_BETA, debug=True)


def _tick(sensor, instance, dsn, cursor=None) -> tuple[list[logging.LogRecord], object]:
    """One evaluation of ``sensor``; the records its context logged (every level)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    ctx = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}
    )
    ctx.log.addHandler(Keep(logging.DEBUG))
    ctx.log.setLevel(logging.DEBUG)
    result = sensor(ctx)
    return records, result


def _info(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno >= logging.INFO]


def test_idle_sensor_ticks_log_at_debug_and_a_tick_that_asks_for_something_at_info(conn, dsn, settings):
    with dg.DagsterInstance.ephemeral() as instance:
        for sensor in (mirror_poller, lakehouse_recorder, source_poller):
            records, _ = _tick(sensor, instance, dsn)
            assert records, f"{sensor.name} logged nothing at all (its tick's log keeps the idle line)"
            assert _info(records) == [], f"{sensor.name} put an idle tick on the console: {_info(records)}"

        ws = datasets.create_workspace(conn, "calm")
        ds = datasets.create_dataset(conn, ws, "clicks", [{"name": "n", "type": "int64"}])
        datasets.insert_rows(conn, ds, [{"n": 1}])
        records, result = _tick(mirror_poller, instance, dsn)
        assert result.run_requests
        assert any(m.startswith("scanned 1 changed datasets") for m in _info(records)), _info(records)


def test_a_stop_signals_the_group_but_the_steps_log_tails(tmp_path):
    """A step's console goes through `tail -F <compute log>`: killed with the group, a run's last lines (a stream's
    hand-over) would reach the compute log only. terminate_group spares it; the step ends it."""
    import signal
    import subprocess

    from lakehouse_dagster.core.process_group import group_members, terminate_group

    log = tmp_path / "step.log"
    log.write_text("")

    def default_sigterm() -> None:
        # The child inherits the worker's signal state: an ignored or blocked SIGTERM (left by an earlier test in
        # this pytest worker, seen once in a full run: `sleep` outlived the signal by 10 s) would test nothing here.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    leader = subprocess.Popen(["sleep", "60"], process_group=0, preexec_fn=default_sigterm)
    tail = subprocess.Popen(
        ["tail", "-F", "-c", "+0", str(log)],
        process_group=leader.pid,
        stdout=subprocess.DEVNULL,
        preexec_fn=default_sigterm,
    )
    try:
        assert set(group_members(leader.pid)) == {leader.pid, tail.pid}
        terminate_group(leader.pid)
        assert leader.wait(10) == -signal.SIGTERM
        with pytest.raises(subprocess.TimeoutExpired):  # a signalled tail ends within milliseconds
            tail.wait(0.5)
    finally:
        tail.kill()
        leader.kill()
        tail.wait(10)
        leader.wait(10)
