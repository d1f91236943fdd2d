"""Alerts (issue 22): the ``lakehouse_alerts`` sensor, evaluated on a real Dagster instance (Postgres storage), posts
each event exactly once to a real HTTP receiver on 127.0.0.1 — a failed run of a lakehouse job, a MISMATCH, an
auto-rollback, a wedged sync, a freshness breach, a native-safety finding; a receiver that hangs or fails does not
stall the tick and the event goes out later (or is dropped after the bounded retries, with a log line); the URL
(a token in its path) appears nowhere; unset, nothing is posted and the tick says why."""

from __future__ import annotations

import http.server
import json
import logging
import re
import threading
import time

import dagster as dg
import pytest
from psycopg.types.json import Jsonb

from lakehouse_dagster.dagster.defs.alerts.alerts_sensor import lakehouse_alerts
from lakehouse_dagster.dagster.defs.mirror.mirror_batch import mirror_batch_job
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.flags import set_override
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.parity import canary
from lakehouse_dagster.runbooks import auto_rollback
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


def test_a_failed_run_of_a_lakehouse_job_is_posted_once(conn, dsn, settings, receiver, instance, tick):
    tick()  # the first tick: nothing has happened yet
    ws = datasets.create_workspace(conn, "w")
    bad = datasets.create_dataset(conn, ws, "bad_orders", [{"name": "n", "type": "int64"}])
    datasets.insert_rows(conn, bad, [{"n": 1}, {"n": "x"}])
    result = mirror_batch_job.execute_in_process(
        instance=instance,
        run_config={"ops": {"mirror_datasets": {"config": {"datasets": [str(bad)]}}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        tags={"lakehouse/dataset": str(bad), "lakehouse/dataset_name": "bad_orders"},
        raise_on_error=False,
    )
    assert not result.success
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
    conn.execute(  # a pipeline starts reading it as input (F3): one more reason, a new finding
        "insert into pipelines (workspace_id, name, spec) values (%s, 'nightly', %s)",
        (ws, Jsonb({"nodes": [{"type": "dataset", "data": {"datasetId": str(d)}}]})),
    )
    assert "native_unsafe 1" in tick() and "BLOCKED (pipeline input)" in receiver.texts()[1]
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
    started = time.monotonic()
    message = tick()
    assert time.monotonic() - started < 5  # one post's timeout (1 s), not the receiver's hang
    assert message.endswith("a post failed (127.0.0.1: no answer within 1 s): 1 event(s) pending, retried next tick")
    assert len(receiver.seen) == 1 and receiver.delivered == []
    receiver.mode = "ok"
    receiver.release.set()
    assert "posted 1 event(s) in 1 message(s)" in tick()
    tick()
    assert len(receiver.delivered) == 1 and receiver.delivered[0]["text"].startswith("Native-safety: ledger")
    assert _outbox(conn) == [("native_unsafe", 2, True, False, False)]
    _assert_secret_kept(conn, tick, caplog, capsys, receiver)


def test_a_failing_receiver_is_retried_a_bounded_number_of_times_then_dropped_with_a_log_line(
    conn, dsn, settings, receiver, tick, monkeypatch, caplog, capsys
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("LAKEHOUSE_ALERT_MAX_ATTEMPTS", "2")
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "ledger", [{"name": "n", "type": "int64"}])
    datasets.insert_rows(conn, d, [{"n": 1}])
    set_override(conn, "write", "cdc.append", "iceberg_native", dataset=d, note="by hand", actor="pytest")
    receiver.mode = "fail"
    assert "a post failed (127.0.0.1: HTTP 500): 1 event(s) pending" in tick()
    assert "1 event(s) dropped after 2 failed posts each" in tick()
    console = capsys.readouterr().err  # the sensor's log (Dagster's console handler)
    dropped = [line for line in console.splitlines() if "alert dropped" in line]
    assert len(dropped) == 1 and dropped[0].endswith(
        "- dagster - WARNING - alert dropped after 2 failed post(s) (last: 127.0.0.1: HTTP 500): Native-safety: "
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


def test_a_rollout_plan_that_pauses_or_aborts_is_posted_once_each_and_the_past_is_not_replayed(
    conn, dsn, settings, receiver, tick
):
    from lakehouse_dagster.plans import actions
    from lakehouse_dagster_tests.rollout_helpers import seed_mix

    s = seed_mix(conn, dsn, settings)
    old_id, _ = actions.start(conn, settings, "reader: studio.digest\nstages:\n  - datasets: 1\n", actor="pytest")
    actions.pause(conn, old_id, actor="ops", reason="before alerts were on")
    actions.abort(conn, settings, old_id, actor="ops", reason="an old plan")
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
    actions.abort(conn, settings, plan_id, actor="ops", reason="wrong week")
    assert tick().startswith("1 new event(s) (rollout 1)")
    aborted = receiver.texts()[-1]
    assert aborted.startswith(f"Rollout plan: rollout {plan_id} (reader graph.kuzu → iceberg) aborted at stage 1: ")
    assert "wrong week" in aborted and "back to its value before the plan" in aborted
    assert "aborting" not in aborted.split(":")[1]  # the abort is told once, when done
    tick()
    assert len(receiver.delivered) == 2
