"""Alerts (issue 22): the ``lakehouse_alerts`` sensor, evaluated on a real Dagster instance (Postgres storage), posts
each event exactly once to a real HTTP receiver on 127.0.0.1 — a failed run of a lakehouse job, a MISMATCH, an
auto-rollback, a wedged sync, a freshness breach, a native-safety finding; a receiver that hangs or fails does not
stall the tick and the event goes out later (or is dropped after the bounded retries, with a log line); the URL
(a token in its path) appears nowhere; unset, nothing is posted and the tick says why."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import logging
import re
import threading
import time

import dagster as dg
import psycopg
import pytest
from psycopg.types.json import Jsonb

from lakehouse_dagster.dagster.defs.alerts import alerts_sensor
from lakehouse_dagster.dagster.defs.alerts.alerts_sensor import lakehouse_alerts
from lakehouse_dagster.dagster.defs.mirror.mirror_batch import mirror_batch_job
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.flags import set_override
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.parity import canary
from lakehouse_dagster.runbooks import auto_rollback
from lakehouse_dagster.status import alerts
from lakehouse_dagster.tracking import datasets
from lakehouse_dagster_tests.conftest import pg_dagster_instance
from lakehouse_dagster_tests.test_canary import behind_the_mirrors_back, evaluate, make_dataset, sync

TOKEN = "xoxb-S3CRET-T0KEN-4242"


class Receiver:
    """A Slack-compatible receiver on 127.0.0.1: answers 200 (``ok``), 500 (``fail``) or holds the request until
    released (``hang``). ``delivered``: the JSON bodies it answered 2xx; ``seen``: every request's body."""

    def __init__(self):
        self.mode = "ok"
        self.delivered: list[dict] = []
        self.seen: list[dict] = []
        self.answered = 0  # requests answered (a hung one is answered when released, or after 30 s)
        self.release = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.seen.append(body)
                if receiver.mode == "hang":
                    receiver.release.wait(30)
                    self.send_response(504)
                elif receiver.mode == "fail":
                    self.send_response(500)
                else:
                    receiver.delivered.append(body)
                    self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")
                receiver.answered += 1

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T0000/B0000/{TOKEN}"

    def texts(self) -> list[str]:
        return [b["text"] for b in self.delivered]

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings, monkeypatch):
    r = Receiver()
    monkeypatch.setenv("LAKEHOUSE_ALERT_WEBHOOK_URL", r.url)
    monkeypatch.setenv("LAKEHOUSE_ALERT_TIMEOUT_SECONDS", "1")
    yield r
    r.close()


@pytest.fixture
def instance(pg_admin_dsn, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    with pg_dagster_instance(pg_admin_dsn, home) as (inst, _):
        yield inst


class Ticks:
    """Evaluates the sensor as the daemon does: each tick gets the cursor the previous one stored."""

    def __init__(self, instance, dsn):
        self.instance, self.dsn, self.cursor = instance, dsn, None
        self.messages: list[str] = []
        self.cursors: list[str] = []

    def __call__(self) -> str:
        defs = dg.Definitions(
            jobs=[mirror_batch_job],
            sensors=[lakehouse_alerts],
            resources={"lakehouse": LakehouseResource(pg_dsn=self.dsn)},
        )
        resources = {"lakehouse": LakehouseResource(pg_dsn=self.dsn)}
        with dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, definitions=defs, resources=resources
        ) as ctx:
            result = lakehouse_alerts(ctx)
        if isinstance(result, dg.SkipReason):  # Postgres down: nothing posted, the cursor where it was
            self.messages.append(result.skip_message or "")
            return result.skip_message or ""
        assert isinstance(result, dg.SensorResult) and not result.run_requests
        self.cursor = result.cursor
        self.messages.append(result.skip_reason.skip_message)
        self.cursors.append(result.cursor)
        return result.skip_reason.skip_message


@pytest.fixture
def tick(instance, dsn):
    return Ticks(instance, dsn)


def _flipped(conn, settings, dsn, name: str, n: int = 6):
    d = make_dataset(conn, n, name=name)
    sync(settings, dsn, d)
    set_override(conn, "read", "export.stream", "iceberg", dataset=d, note="fase1 canary", actor="pytest")
    return d


def _outbox(conn) -> list[tuple]:
    return conn.execute(
        "select kind, attempts, posted_at is not null, dropped_at is not null, resolved_at is not null"
        " from lakehouse_alerts order by id"
    ).fetchall()


def failed_batch_run(instance, dsn, bad):
    """A mirror_batch_job run of dataset ``bad`` (named bad_orders, a row that does not fit) that fails."""
    result = mirror_batch_job.execute_in_process(
        instance=instance,
        run_config={"ops": {"mirror_datasets": {"config": {"datasets": [str(bad)]}}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        tags={"lakehouse/dataset": str(bad), "lakehouse/dataset_name": "bad_orders"},
        raise_on_error=False,
    )
    assert not result.success
    return result


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_failed_run_of_a_lakehouse_job_is_posted_once(conn, dsn, settings, receiver, instance, tick):
    tick()  # the first tick: nothing has happened yet
    ws = datasets.create_workspace(conn, "w")
    bad = datasets.create_dataset(conn, ws, "bad_orders", [{"name": "n", "type": "int64"}])
    datasets.insert_rows(conn, bad, [{"n": 1}, {"n": "x"}])
    result = failed_batch_run(instance, dsn, bad)
    assert tick().startswith("1 new event(s) (run_failed 1); posted 1 event(s) in 1 message(s)")
    (text,) = receiver.texts()
    assert text.startswith(f"Lakehouse run failed: job mirror_batch_job run {result.run_id[:8]} for bad_orders: ")
    assert "row_index 1 column n: expected int64, got a JSON string" in text
    assert f"Runs → {result.run_id}" in text and f"lakehouse sync --dataset {bad}" in text
    assert "Refused" not in text  # the reason, not the exception's name
    # later ticks, a cursor lost (a reset), a new process: never again
    tick()
    tick.cursor = None
    tick()
    assert len(receiver.delivered) == 1 and _outbox(conn) == [("run_failed", 1, True, False, False)]


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_mismatch_and_its_auto_rollback_are_posted_once_each(conn, dsn, settings, receiver, tick):
    tick()
    d = _flipped(conn, settings, dsn, "orders")
    behind_the_mirrors_back(  # the triggers bypassed: Postgres differs and the versions still agree
        conn,
        'update dataset_rows set data = data || \'{"s": "tampered"}\' where dataset_id = %s and row_index = 2',
        (d,),
    )
    report = auto_rollback.run_canary_and_roll_back(
        conn, dsn, load_catalog(settings, dsn), settings, dataset_ids=[str(d)], source="canary"
    )
    assert [v.verdict for v in report.results] == ["MISMATCH"]
    assert tick().startswith("2 new event(s) (mismatch 1, auto_rollback 1); posted 2 event(s) in 2 message(s)")
    mismatch, rollback = receiver.texts()
    assert mismatch.startswith(f"Parity MISMATCH: orders ({d}) is caught up (Postgres version ")
    assert "first differing __row_index: 2 (found by lakehouse canary)" in mismatch
    assert f"STOP: do not flip or widen it; investigate. Re-check: lakehouse canary --smoke --dataset {d}" in mismatch
    assert rollback.startswith(f"Auto-rollback: after the MISMATCH on orders ({d})")
    assert f"reader export.stream iceberg → off for orders ({d}) at dataset scope" in rollback
    assert f"lakehouse flags list --dataset {d}" in rollback
    tick()
    assert len(receiver.delivered) == 2


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_an_auto_rollback_written_after_its_mismatch_was_posted_still_goes_out(conn, dsn, settings, receiver, tick):
    tick()
    d = _flipped(conn, settings, dsn, "events")
    behind_the_mirrors_back(conn, "delete from dataset_rows where dataset_id = %s and row_index = 0", (d,))
    v = evaluate(settings, dsn, d)
    parity_id = canary.record(conn, v, source="schedule", run_id="run-1234abcd")  # the row, before its outcome
    assert "mismatch 1" in tick() and len(receiver.delivered) == 1
    auto_rollback.after_record(
        conn, v, source="schedule", run_id="run-1234abcd", parity_id=parity_id, settings=settings
    )
    assert tick().startswith("1 new event(s) (auto_rollback 1)")
    assert receiver.texts()[1].startswith(
        f"Auto-rollback: after the MISMATCH on events ({d}) (found by the canary schedule, run run-1234)"
    )


def test_a_wedged_sync_is_posted_once(conn, dsn, settings, receiver, tick, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_WEDGED_AFTER_SECONDS", "1")
    ws = datasets.create_workspace(conn, "w")
    bad = datasets.create_dataset(conn, ws, "stuck", [{"name": "n", "type": "int64"}])
    datasets.insert_rows(conn, bad, [{"n": "x"}])
    with pytest.raises(Exception, match="expected int64"):
        sync(settings, dsn, bad)
    time.sleep(1.5)
    assert tick().startswith("1 new event(s) (wedged 1)")
    (text,) = receiver.texts()
    assert text.startswith(f"Wedged sync: stuck ({bad}): its latest sync (")
    assert re.search(r"\) failed \(it started [12] s ago\) and no sync has succeeded since: .*expected int64", text)
    assert f"lakehouse sync --dataset {bad}" in text
    tick()
    assert len(receiver.delivered) == 1


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_freshness_breach_is_one_event_per_episode(conn, dsn, settings, receiver, tick, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_LAGGING_AFTER_SECONDS", "1")
    d = _flipped(conn, settings, dsn, "clicks")
    quiet = make_dataset(conn, 3, name="not-flipped")  # behind too, but nothing reads it from Iceberg
    sync(settings, dsn, quiet)
    datasets.insert_rows(conn, quiet, [{"s": "late"}])
    datasets.insert_rows(conn, d, [{"s": "late"}])  # Postgres moves on, the mirror does not run
    time.sleep(1.5)
    assert tick().startswith("1 new event(s) (freshness 1)")
    (text,) = receiver.texts()
    assert text.startswith(f"Freshness breach: clicks ({d}) is flipped to Iceberg and its Iceberg view is ")
    assert f"lakehouse sync --dataset {d}" in text
    tick()
    assert len(receiver.delivered) == 1
    sync(settings, dsn, d)  # caught up: the breach is over
    tick()
    assert _outbox(conn) == [("freshness", 1, True, False, True)]
    datasets.insert_rows(conn, d, [{"s": "later"}])  # behind again, past the threshold: a new episode
    time.sleep(1.5)
    assert tick().startswith("1 new event(s) (freshness 1)") and len(receiver.delivered) == 2


def test_a_native_safety_finding_is_posted_once_and_again_when_its_reasons_change(conn, dsn, settings, receiver, tick):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "ledger", [{"name": "n", "type": "int64"}])
    datasets.insert_rows(conn, d, [{"n": 1}])
    set_override(conn, "write", "cdc.append", "iceberg_native", dataset=d, note="by hand", actor="pytest")
    assert tick().startswith("1 new event(s) (native_unsafe 1)")
    (text,) = receiver.texts()
    assert text.startswith(f"Native-safety: ledger ({d}) is written iceberg-native but fails the write-flip gates")
    assert "never mirrored" in text and f"lakehouse write-flags set <writer> pg --dataset {d}" in text
    tick()
    assert len(receiver.delivered) == 1
    set_reverse(conn, False, dataset=d, note="reverse off", actor="pytest")  # with it on, a pipeline input is fine
    conn.execute(  # a pipeline starts reading it as input (F3): one more reason, a new finding
        "insert into pipelines (workspace_id, name, spec) values (%s, 'nightly', %s)",
        (ws, Jsonb({"nodes": [{"type": "dataset", "data": {"datasetId": str(d)}}]})),
    )
    assert "native_unsafe 1" in tick() and "BLOCKED (pipeline input; reverse mirror off)" in receiver.texts()[1]
    conn.execute("delete from pipelines")
    set_override(conn, "write", "cdc.append", "pg", dataset=d, note="rolled back", actor="pytest")
    tick()  # safe again: both findings resolved, nothing posted
    assert len(receiver.delivered) == 2
    assert [r[4] for r in _outbox(conn)] == [True, True]


def test_a_hanging_receiver_does_not_stall_the_tick_and_the_event_goes_out_later(
    conn, dsn, settings, receiver, tick, caplog, capsys
):
    caplog.set_level(logging.DEBUG)
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "ledger", [{"name": "n", "type": "int64"}])
    datasets.insert_rows(conn, d, [{"n": 1}])
    set_override(conn, "write", "cdc.append", "iceberg_native", dataset=d, note="by hand", actor="pytest")
    receiver.mode = "hang"
    message = tick()
    assert receiver.answered == 0  # the tick ended while the receiver still hangs: one post's timeout, not the hang
    assert re.search(
        r"a post failed \(127\.0\.0\.1: no answer within 1 s\): 1 event\(s\) pending, retried with backoff "
        r"\(next try \d\d:\d\d:\d\d UTC\)$",
        message,
    )
    assert len(receiver.seen) == 1 and receiver.delivered == []
    receiver.mode = "ok"
    receiver.release.set()
    assert "posted 0 event(s)" in tick()  # its backoff has not elapsed
    _backoff_elapsed(conn)
    assert "posted 1 event(s) in 1 message(s)" in tick()
    tick()
    assert len(receiver.delivered) == 1 and receiver.delivered[0]["text"].startswith("Native-safety: ledger")
    assert _outbox(conn) == [("native_unsafe", 2, True, False, False)]
    _assert_secret_kept(conn, tick, caplog, capsys, receiver)


def _backoff_elapsed(conn) -> None:
    """Time passes: every waiting event's next try is due (the sensor's clock is the wall clock)."""
    conn.execute("update lakehouse_alerts set next_attempt_at = now() where next_attempt_at is not null")


def test_a_failing_receiver_is_retried_with_backoff_for_a_bounded_time_then_dropped_with_a_log_line(
    conn, dsn, settings, receiver, tick, monkeypatch, caplog, capsys
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("LAKEHOUSE_ALERT_RETRY_SECONDS", "3600")
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "ledger", [{"name": "n", "type": "int64"}])
    datasets.insert_rows(conn, d, [{"n": 1}])
    set_override(conn, "write", "cdc.append", "iceberg_native", dataset=d, note="by hand", actor="pytest")
    receiver.mode = "fail"
    assert "a post failed (127.0.0.1: HTTP 500): 1 event(s) pending" in tick()
    conn.execute("update lakehouse_alerts set created_at = now() - interval '61 minutes'")  # an hour of outage
    _backoff_elapsed(conn)
    assert "1 event(s) dropped (see the log)" in tick()
    console = capsys.readouterr().err  # the sensor's log (Dagster's console handler)
    dropped = [line for line in console.splitlines() if "alert dropped" in line]
    assert len(dropped) == 1 and dropped[0].endswith(
        "- dagster - WARNING - alert dropped after 2 failed post(s) over more than 60 min (last: 127.0.0.1: HTTP 500): "
        "Native-safety: "
        f"ledger ({d}) is written iceberg-native but fails the write-flip gates, so its native writes are refused: "
        f"never mirrored: sync it first (lakehouse sync --dataset {d}); readers still on Postgres for it: export.stream (of…"
    )
    receiver.mode = "ok"
    tick()
    assert receiver.delivered == [] and len(receiver.seen) == 2
    assert _outbox(conn) == [("native_unsafe", 2, False, True, False)]
    _assert_secret_kept(conn, tick, caplog, capsys, receiver, console)


def _assert_secret_kept(conn, tick, caplog, capsys, receiver, console: str = "") -> None:
    """The URL's token is nowhere: log records, console, tick messages, cursors, the outbox, the posted bodies."""
    out = capsys.readouterr()
    rows = json.dumps(conn.execute("select row_to_json(a) from lakehouse_alerts a").fetchall(), default=str)
    places = {
        "logs": "\n".join(r.getMessage() for r in caplog.records),
        "console": console + out.out + out.err,
        "ticks": "\n".join(tick.messages),
        "cursors": "\n".join(tick.cursors),
        "outbox": rows,
        "bodies": json.dumps(receiver.seen),
    }
    for where, text in places.items():
        assert TOKEN not in text and "/services/" not in text, where


def test_unset_posts_nothing_and_says_why(conn, dsn, settings, tick, monkeypatch):
    monkeypatch.delenv("LAKEHOUSE_ALERT_WEBHOOK_URL", raising=False)
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "ledger", [{"name": "n", "type": "int64"}])
    datasets.insert_rows(conn, d, [{"n": 1}])
    set_override(conn, "write", "cdc.append", "iceberg_native", dataset=d, note="by hand", actor="pytest")
    assert tick() == (  # "idle" first: the sensors page shows the latest tick's reason (issue 33)
        "idle, alerts are off: LAKEHOUSE_ALERT_WEBHOOK_URL is not set: no alert is posted (set it to a Slack "
        "incoming-webhook URL, "
        'or any receiver of a JSON body {"text": ...})'
    )
    assert _outbox(conn) == []
    monkeypatch.setenv("LAKEHOUSE_ALERT_WEBHOOK_URL", f"ftp://example.com/{TOKEN}")
    message = tick()
    assert "is not an http(s) URL with a host" in message and TOKEN not in message and _outbox(conn) == []


def test_many_events_of_one_kind_go_out_as_one_message_each_event_once(conn, dsn, settings, receiver, tick):
    ws = datasets.create_workspace(conn, "w")
    ids = []
    for i in range(4):
        d = datasets.create_dataset(conn, ws, f"ledger{i}", [{"name": "n", "type": "int64"}])
        datasets.insert_rows(conn, d, [{"n": 1}])
        ids.append(d)
    set_override(conn, "write", "cdc.append", "iceberg_native", workspace=ws, note="by hand", actor="pytest")
    assert "posted 4 event(s) in 1 message(s)" in tick()
    (text,) = receiver.texts()
    assert text.startswith("4 native-safety findings:\n• Native-safety: ledger")
    for i, d in enumerate(ids):
        assert text.count(f"ledger{i} ({d}) is written iceberg-native") == 1
    tick()
    assert len(receiver.delivered) == 1


def test_a_failed_batch_run_names_a_few_datasets_and_counts_the_rest(settings, receiver):
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.status.alerts import FailedRun, failed_run_event

    ids = tuple(f"00000000-0000-0000-0000-{i:012d}" for i in range(1000))
    names = tuple(f"ds{i}" for i in range(40))  # the names tag, cut to 255 characters
    run = FailedRun("0123456789abcdef", "parity_canary_batch_job", None, "1 of 1000 dataset(s) failed", ids, names)
    e = failed_run_event(run)
    assert e.what == (
        "job parity_canary_batch_job run 01234567 for ds0, ds1, ds2, ds3, ds4 and 995 more: 1 of 1000 dataset(s) failed"
    )
    assert "lakehouse canary --smoke --dataset <uuid>" in e.act and e.dataset_id is None
    assert TOKEN not in repr(Settings.from_env())  # the URL is set (fixture): a repr of the settings never shows it


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_rollout_plan_that_pauses_or_aborts_is_posted_once_each_and_the_past_is_not_replayed(
    conn, dsn, settings, receiver, tick
):
    from lakehouse_dagster.plans import actions
    from lakehouse_dagster_tests.rollout_helpers import seed_mix

    s = seed_mix(conn, dsn, settings)
    old_id, _ = actions.start(conn, settings, "reader: studio.digest\nstages:\n  - datasets: 1\n", actor="pytest")
    actions.pause(conn, old_id, actor="ops", reason="before alerts were on")
    actions.abort(conn, settings.project, old_id, actor="ops", reason="an old plan")
    tick()  # the first tick starts at the newest event: the old plan's pause and abort are not posted
    assert receiver.delivered == []
    plan_id, _ = actions.start(
        conn, settings, f"reader: graph.kuzu\nstages:\n  - datasets: 1\n  - workspace: {s.ws}\n", actor="pytest"
    )
    actions.pause(conn, plan_id, actor="ops", reason="the graph team asked to wait")
    assert tick().startswith("1 new event(s) (rollout 1); posted 1 event(s) in 1 message(s)")
    (paused,) = receiver.texts()
    assert paused.startswith(f"Rollout plan: rollout {plan_id} (reader graph.kuzu → iceberg) paused at stage 1: ")
    assert "the graph team asked to wait" in paused
    assert f"lakehouse rollout resume {plan_id}" in paused and f"lakehouse rollout status {plan_id}" in paused
    tick()
    assert len(receiver.delivered) == 1  # once
    actions.abort(conn, settings.project, plan_id, actor="ops", reason="wrong week")
    assert tick().startswith("1 new event(s) (rollout 1)")
    aborted = receiver.texts()[-1]
    assert aborted.startswith(f"Rollout plan: rollout {plan_id} (reader graph.kuzu → iceberg) aborted at stage 1: ")
    assert "wrong week" in aborted and "back to its value before the plan" in aborted
    assert "aborting" not in aborted.split(":")[1]  # the abort is told once, when done
    tick()
    assert len(receiver.delivered) == 2


# --- Issue 32: the cursor moves past a full page; late rollout events; delivery through an outage ---------------


def _burst_of_failed_runs(instance, n: int) -> list[str]:
    """``n`` failed runs of a lakehouse job in a few seconds (created and failed as the run worker does)."""
    ids = []
    for i in range(n):
        run = instance.add_run(dg.DagsterRun(job_name=mirror_batch_job.name, status=dg.DagsterRunStatus.STARTED))
        instance.report_run_failed(run, message=f"burst failure {i}")
        ids.append(run.run_id)
    return ids


def _posted_ids(receiver, pattern: str) -> list[str]:
    return [m for b in receiver.delivered for m in re.findall(pattern, b["text"])]


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_burst_of_failed_runs_over_several_pages_is_alerted_every_one_once(
    conn, dsn, settings, receiver, instance, tick, monkeypatch
):
    """Before: the failed runs were read 200 at a time from the cursor minus 10 min, so with 200 or more failures in
    10 minutes every tick read the same 200 and the rest were never alerted. The page (200) and the look-back's read
    (1,000) are made small here so that 2½ pages of failures take seconds to make, not minutes; the look-back reads
    fewer than a page, so only a position that moves past each full page reaches them all."""
    monkeypatch.setattr(alerts_sensor, "RUN_PAGE", 20)
    monkeypatch.setattr(alerts, "RUNS_LOOKBACK_READ", 5)
    tick()
    ids = _burst_of_failed_runs(instance, 50)
    for _ in range(5):
        tick()
    recorded = {r[0] for r in conn.execute("select key from lakehouse_alerts where kind = 'run_failed'").fetchall()}
    assert recorded == {f"run_failed:{i}" for i in ids}
    posted = _posted_ids(receiver, r"Runs → ([0-9a-f-]{36})")
    assert sorted(posted) == sorted(ids)  # every one, none twice
    tick.cursor = None  # a lost cursor: the look-back reads them again, and posts none of them twice
    tick()
    assert len(_posted_ids(receiver, r"Runs → ([0-9a-f-]{36})")) == 50


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_600_mismatches_with_nothing_to_roll_back_are_alerted_every_one_once(conn, dsn, settings, receiver, tick):
    """Before: a MISMATCH whose auto-rollback outcome was "already off" was read again every tick within the hour,
    and 500 of them (a page) hid every later row for good."""
    tick()
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "orders", [{"name": "n", "type": "int64"}])
    quiet = Jsonb({"auto_rollback": {"actions": [{"kind": "read", "status": "already"}], "lines": ["already off"]}})
    ids = [
        r[0]
        for r in conn.execute(
            "insert into lakehouse_read_parity (dataset_id, verdict, source, detail, checked_at)"
            " select %s, 'MISMATCH', 'schedule', %s, now() - interval '5 minutes' + i * interval '100 ms'"
            " from generate_series(1, 600) i returning id",
            (d, quiet),
        ).fetchall()
    ]
    for _ in range(4):
        tick()
    keys = [r[0] for r in conn.execute("select key from lakehouse_alerts where kind = 'mismatch'").fetchall()]
    assert sorted(keys) == sorted(f"mismatch:{i}" for i in ids)
    assert conn.execute("select count(*) from lakehouse_alerts where kind <> 'mismatch'").fetchone()[0] == 0
    texts = [b["text"] for b in receiver.delivered]
    assert sum(t.count("Parity MISMATCH: orders") for t in texts) == 600  # every one posted, once


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_rollout_event_committing_after_a_later_one_was_read_is_posted_once(conn, dsn, settings, receiver, tick):
    """Before: the plans' events were read by id, and an event whose transaction committed after a later id was
    read was never posted."""
    from lakehouse_dagster.plans import actions, store
    from lakehouse_dagster_tests.rollout_helpers import seed_mix

    seed_mix(conn, dsn, settings)
    early, _ = actions.start(conn, settings, "reader: graph.kuzu\nstages:\n  - datasets: 1\n", actor="pytest")
    later, _ = actions.start(conn, settings, "reader: studio.digest\nstages:\n  - datasets: 1\n", actor="pytest")
    tick()
    with psycopg.connect(dsn) as held:  # not autocommit: the event's transaction stays open
        store.event(held, early, store.PAUSED_EVENT, stage=0, severity="warning", reason="held back")
        store.event(conn, later, store.PAUSED_EVENT, stage=0, severity="warning", reason="committed first")
        assert "rollout 1" in tick()
        held.commit()
    assert "rollout 1" in tick()
    tick()
    texts = receiver.texts()
    assert len(texts) == 2 and "committed first" in texts[0] and "held back" in texts[1]
    assert f"rollout {early}" in texts[1]


class Webhook:
    """A receiver on 127.0.0.1 that is up (200), failing (503), down (the port refuses) or slow (takes the post,
    answers after ``slow_seconds``: the sender times out although the post arrived). It counts what arrived per
    idempotency key, as a receiver that drops repeats would."""

    def __init__(self):
        self.mode = "up"
        self.slow_seconds = 2.0
        self.arrived: list[dict] = []  # every body that reached the handler (also when the sender gave up)
        self.headers: list[str | None] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if hook.mode == "failing":
                    self.send_response(503)
                    self.end_headers()
                    return
                hook.arrived.append(body)
                hook.headers.append(self.headers.get("Idempotency-Key"))
                if hook.mode == "slow":
                    time.sleep(hook.slow_seconds)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.handler = Handler
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}/services/T0000/B0000/{TOKEN}"
        self._serve()

    def _serve(self):
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self):
        self.server.shutdown()
        self.server.server_close()

    def up(self):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)
        self._serve()
        self.mode = "up"

    def by_key(self) -> dict[str, dict]:
        """The bodies as a receiver that drops repeats keeps them: one per idempotency key."""
        return {b["idempotency_key"]: b for b in self.arrived}


@pytest.fixture
def webhook():
    w = Webhook()
    yield w
    w.down()


def _record_some(conn, n_runs: int = 25, n_alone: int = 2) -> list:

    events = [
        alerts.Event(f"run_failed:run-{i:04d}", alerts.RUN_FAILED, None, f"job x run run-{i:04d}: boom", "look")
        for i in range(n_runs)
    ] + [
        alerts.Event(f"wedged:sync-{i}", alerts.WEDGED, None, f"sync-{i} has been running for 2 h", "look")
        for i in range(n_alone)
    ]
    alerts.record(conn, events, {})
    return events


def _tick_at(conn, settings, webhook, now, timeout: float = 1.0):
    """One tick of the alerts at the clock ``now`` (the events recorded already), posting to ``webhook``."""

    s = settings.replace(alerts={"webhook_url": webhook.url, "timeout_seconds": timeout})
    tick = alerts.run_tick(conn, s, alerts.Cursor(), [], now=now)
    assert tick.delivery is not None
    return tick.delivery


def test_a_webhook_down_for_an_hour_loses_nothing_and_each_alert_arrives_once_per_key(conn, settings, webhook):
    """Before: attempts were counted per 60 s tick with no backoff, so about five minutes of outage dropped the
    alerts at the head of the queue. The clock is driven through ``now``: one tick a minute."""

    events = _record_some(conn)
    start = conn.execute("select now()").fetchone()[0]

    def deliver(minute: float):
        return _tick_at(conn, settings, webhook, start + dt.timedelta(minutes=minute))

    webhook.mode = "failing"
    for minute in range(0, 30):  # half an hour of 503 ...
        d = deliver(minute)
        assert d.dropped == [] and d.pending == len(events)
        assert d.failure is None or d.failure == "127.0.0.1: HTTP 503"
    webhook.down()
    for minute in range(30, 61):  # ... then half an hour of a port that refuses
        d = deliver(minute)
        assert d.dropped == [] and d.pending == len(events)
        assert d.failure is None or d.failure.startswith("127.0.0.1: ConnectionRefusedError")
    attempts = [r[0] for r in conn.execute("select attempts from lakehouse_alerts").fetchall()]
    assert 1 <= max(attempts) <= 16  # backoff: not one attempt a tick
    assert conn.execute("select count(*) from lakehouse_alerts where dropped_at is not null").fetchone()[0] == 0
    webhook.up()
    for minute in range(61, 90):  # the first message due after its backoff (15 min at most) goes out, then all
        d = deliver(minute)
        if d.pending == 0:
            break
    assert d.pending == 0 and d.failure is None and minute <= 61 + alerts.BACKOFF_MAX_SECONDS / 60
    kept = webhook.by_key()
    assert len(kept) == len(webhook.arrived)  # each key arrived once
    assert webhook.headers == [b["idempotency_key"] for b in webhook.arrived]  # the header says the same
    for e in events:
        assert sum(e.message in b["text"] for b in kept.values()) == 1, e.key
    assert conn.execute("select count(*) from lakehouse_alerts where posted_at is null").fetchone()[0] == 0


def test_a_post_that_timed_out_but_arrived_is_sent_again_under_the_same_key(conn, settings, webhook):
    (event,) = _record_some(conn, n_runs=0, n_alone=1)
    now = conn.execute("select now()").fetchone()[0]
    webhook.mode = "slow"
    d = _tick_at(conn, settings, webhook, now, timeout=0.5)
    assert d.failure == "127.0.0.1: no answer within 0.5 s" and d.pending == 1
    webhook.mode = "up"
    d = _tick_at(conn, settings, webhook, now + dt.timedelta(minutes=2), timeout=0.5)
    assert d.posted == 1 and d.pending == 0
    first, second = webhook.arrived  # it arrived twice ...
    assert first == second and first["idempotency_key"].startswith("lakehouse-alert-")
    assert len(webhook.by_key()) == 1  # ... under one key: a receiver that drops repeats shows it once
    assert first["text"] == event.message


def test_past_the_bound_the_oldest_waiting_alerts_are_dropped_with_one_alert_that_says_so(conn, webhook):

    _record_some(conn, n_runs=30, n_alone=0)
    now = conn.execute("select now()").fetchone()[0]
    webhook.mode = "failing"
    d = alerts.deliver(conn, webhook.url, timeout=1.0, retry_seconds=86_400, now=now, max_pending=10)
    assert len(d.dropped) == 1 and d.dropped[0].startswith("21 alert(s) recorded since ")
    assert "were dropped unsent: more than 10 waited" in d.dropped[0]
    left = conn.execute("select kind, message from lakehouse_alerts where dropped_at is null order by id").fetchall()
    assert len(left) == 10 and left[-1][0] == "dropped" and left[-1][1].startswith("Alerts dropped: 21 alert(s)")
    assert [m for _, m in left[:9]] == [
        f"Lakehouse run failed: job x run run-{i:04d}: boom\n→ look" for i in range(21, 30)
    ]


def test_the_sensors_page_says_alerts_are_off_without_a_webhook():
    """Issue 33: the sensors page shows the description (the skip reason hides in a tooltip), so it says first
    whether alerts are on, and never repeats the URL (a secret)."""
    assert alerts_sensor.description(None).startswith("IDLE, alerts are off: LAKEHOUSE_ALERT_WEBHOOK_URL is not set")
    odd = alerts_sensor.description("hooks.example/secret-token")
    assert odd.startswith("IDLE, alerts are off: LAKEHOUSE_ALERT_WEBHOOK_URL is set but is not an http(s) URL")
    assert "secret-token" not in odd
    assert alerts_sensor.description("https://hooks.example/secret-token") == alerts_sensor.WHAT_IT_POSTS


def _stream_row(conn, shard: int, count: int, run_id: str, *, beat_s_ago: float, ended: bool = False) -> None:
    """A mirror stream's heartbeat row as ``ShardLease`` writes it (the next run of the shard replaces it)."""
    conn.execute(
        """insert into lakehouse_mirror_streams (shard_count, shard, run_id, started_at, heartbeat_at, deadline_at,
                  ended_at)
           values (%(count)s, %(shard)s, %(run)s, now() - interval '600 seconds', now() - make_interval(secs => %(s)s),
                   now() + interval '300 seconds', case when %(ended)s then now() - make_interval(secs => %(s)s) end)
           on conflict (shard_count, shard) do update set run_id = excluded.run_id, started_at = excluded.started_at,
                  heartbeat_at = excluded.heartbeat_at, ended_at = excluded.ended_at""",
        {"count": count, "shard": shard, "run": run_id, "s": beat_s_ago, "ended": ended},
    )


def test_a_mirror_stream_shard_down_past_the_bound_is_posted_once_per_outage(conn, settings, webhook):
    on = settings.replace(stream={"enabled": True, "shards": 2, "down_seconds": 30})
    now = conn.execute("select now()").fetchone()[0]
    minute = iter(range(100))

    def tick(s=on) -> list[str]:
        """One tick a minute later; the texts posted by it."""
        before = len(webhook.arrived)
        _tick_at(conn, s, webhook, now + dt.timedelta(minutes=next(minute)))
        return [b["text"] for b in webhook.arrived[before:]]

    _stream_row(conn, 0, 2, "run-alive-0", beat_s_ago=1)
    _stream_row(conn, 1, 2, "run-dead-1", beat_s_ago=20)  # silent, but within the bound: not yet down
    assert tick() == []
    _stream_row(conn, 1, 2, "run-dead-1", beat_s_ago=95)
    (text,) = tick()
    assert re.sub(r"for 9[5-9] s", "for 95 s", text) == (
        "Mirror stream down: shard 1 of 2 has had no live stream for 95 s (bound 30 s): its run run-dead-1 stopped "
        "beating its heartbeat (its process died or hung); batch runs (mirror_batch_job) cover its datasets "
        "meanwhile\n→ Dagster UI, Runs → run-dead-1 (its log says where it stopped); the mirror_poller sensor "
        "starts a replacement by itself (its ticks say what it requested); each shard as it is now: lakehouse status"
    )
    assert tick() == []  # the same outage on the next tick: nothing more
    _stream_row(conn, 1, 2, "run-dead-1b", beat_s_ago=200)  # its replacement died too: still the same outage
    assert tick() == []
    _stream_row(conn, 1, 2, "run-back-1", beat_s_ago=0.5)  # a stream is back: the outage is over ...
    assert tick() == []
    assert _outbox(conn) == [("stream_down", 1, True, False, True)]  # posted once, resolved
    _stream_row(conn, 1, 2, "run-back-1", beat_s_ago=60, ended=True)  # ... and a new one: it let go, no successor
    (again,) = tick()
    assert re.match(
        r"Mirror stream down: shard 1 of 2 has had no live stream for 6\d s \(bound 30 s\): its run ", again
    )
    assert "run-back-1 let go of it and no successor took it" in again
    assert "lakehouse/stream_shard=1/2" in again
    rows = conn.execute(
        "select key, posted_at is not null, resolved_at is not null from lakehouse_alerts order by id"
    ).fetchall()
    assert rows == [("stream_down:1/2", True, True), ("stream_down:1/2", True, False)]


def test_no_stream_down_alert_while_streaming_is_off_or_the_shard_is_alive(conn, settings, webhook):
    now = conn.execute("select now()").fetchone()[0]
    on = settings.replace(stream={"enabled": True, "shards": 2, "down_seconds": 30})
    assert alerts.stream_events(conn, on.stream) == []  # on, but no shard of 2 ever streamed: how long is not known
    _stream_row(conn, 0, 2, "run-0", beat_s_ago=1)
    _stream_row(conn, 1, 2, "run-1", beat_s_ago=2)
    assert alerts.stream_events(conn, on.stream) == []  # both alive
    _stream_row(conn, 0, 2, "run-0", beat_s_ago=3, ended=True)
    assert alerts.stream_events(conn, on.stream) == []  # a handover: its run let go 3 s ago, a successor takes it
    _stream_row(conn, 0, 2, "run-0", beat_s_ago=500)
    _stream_row(conn, 1, 2, "run-1", beat_s_ago=500)
    off = on.replace(stream={"enabled": False})
    assert alerts.stream_events(conn, off.stream) == []  # streaming off: batch runs mirror every change
    _tick_at(conn, off, webhook, now)
    assert webhook.arrived == []
    # 3 shards now: shard 2 never streamed while its siblings have for 600 s
    three = on.replace(stream={"shards": 3})
    _stream_row(conn, 0, 3, "run-a", beat_s_ago=1)
    _stream_row(conn, 1, 3, "run-b", beat_s_ago=1)
    (e,) = alerts.stream_events(conn, three.stream)
    assert e.key == "stream_down:2/3" and e.what.startswith("shard 2 of 3 has had no live stream for 10 min ")
    assert "it has never streamed" in e.what and "lakehouse/stream_shard=2/3" in e.act


def _native_commit(conn, d, snapshot_id: int, *, s_ago: float) -> None:
    """A succeeded native commit in the sync log, as the native writer records it, ``s_ago`` seconds ago."""
    conn.execute(
        """insert into iceberg_sync_log (dataset_id, sync_id, writer, path, status, snapshot_id, started_at, finished_at)
           values (%s, gen_random_uuid(), 'sync.full', 'native', 'succeeded', %s,
                   now() - make_interval(secs => %s), now() - make_interval(secs => %s))""",
        (d, snapshot_id, s_ago + 1, s_ago),
    )


def test_a_reverse_mirror_behind_past_the_bound_is_posted_once_until_it_catches_up(conn, settings, webhook):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "ledger", [{"name": "n", "type": "int64"}])
    set_override(conn, "write", "sync.full", "iceberg_native", dataset=d, note="by hand", actor="pytest")
    bound = settings.replace(reverse={"lag_alert_seconds": 300})
    _native_commit(conn, d, 11, s_ago=120)
    assert alerts.reverse_events(conn, bound.reverse) == []  # behind, but within the bound
    _native_commit(conn, d, 12, s_ago=400)  # the oldest commit dataset_rows lacks is 400 s old now
    (e,) = alerts.reverse_events(conn, bound.reverse)
    assert e.key == f"reverse_behind:{d}" and e.kind == "reverse_behind" and e.dataset_id == d
    assert e.what == (
        f"ledger ({d}) is written iceberg-native and its reverse mirror has lacked 2 native commit(s) for 6 min "
        "(bound 5 min): dataset_rows is that old for its Postgres-locked consumers, and a writer rollback now would "
        "need lakehouse backfill"
    )
    assert f"lakehouse reverse sync --dataset {d}" in e.act
    now = conn.execute("select now()").fetchone()[0]
    _tick_at(conn, bound, webhook, now)
    _tick_at(conn, bound, webhook, now + dt.timedelta(minutes=1))  # still behind: the same condition, not again
    (posted,) = [b["text"] for b in webhook.arrived if b["text"].startswith("Reverse mirror behind")]
    assert posted.startswith(f"Reverse mirror behind: ledger ({d}) is written iceberg-native")
    # the reverse applies snapshot 12: caught up, the condition resolved; the reverse off alerts nothing either
    conn.execute(
        "insert into lakehouse_reverse_position (dataset_id, snapshot_id, how, pg_rows) values (%s, 12, 'full', 0)",
        (d,),
    )
    assert alerts.reverse_events(conn, bound.reverse) == []
    _tick_at(conn, bound, webhook, now + dt.timedelta(minutes=2))
    assert conn.execute(
        "select count(*), bool_and(resolved_at is not null) from lakehouse_alerts where kind = 'reverse_behind'"
    ).fetchone() == (1, True)
    conn.execute("update lakehouse_reverse_position set applied_at = now() - interval '60 seconds'")
    _native_commit(conn, d, 13, s_ago=10)  # a native commit after that apply
    tight = bound.replace(reverse={"lag_alert_seconds": 1})
    assert [e.key for e in alerts.reverse_events(conn, tight.reverse)] == [f"reverse_behind:{d}"]
    set_reverse(conn, False, dataset=d, note="reverse off", actor="pytest")  # nothing to wait for: no alert
    assert alerts.reverse_events(conn, tight.reverse) == []
