"""The run start gate (launcher/start_gate.py): a terminate that reads a run as not started waits for a worker that
is deciding whether to start it, and the worker lets go once Dagster has stored the run's start or end."""

from __future__ import annotations

import threading
import time
import uuid

import dagster as dg

from lakehouse_dagster.dagster.launcher.start_gate import WorkerGate, terminate_gate


def _run(instance: dg.DagsterInstance) -> dg.DagsterRun:
    return instance.add_run(dg.DagsterRun(job_name="gate_job", run_id=str(uuid.uuid4())))


def test_terminate_waits_for_a_worker_until_its_run_has_started_or_ended():
    with dg.DagsterInstance.ephemeral() as instance:
        run = _run(instance)
        gate = WorkerGate(run.run_id)
        gate.hold()
        gate.watch(instance)
        got: list[tuple[bool, float]] = []

        def terminate() -> None:
            with terminate_gate(run.run_id, timeout=20) as held:
                got.append((held, time.monotonic()))

        t = threading.Thread(target=terminate)
        t.start()
        time.sleep(0.5)
        assert got == []  # the worker is between its read of the run and its start: terminate waits
        instance.report_engine_event("an engine event is not the start", run)
        time.sleep(0.3)
        assert got == []
        released_at = time.monotonic()
        instance.report_run_canceled(run, message="ended")  # the run's end is stored: the worker lets go
        t.join(10)
        assert got and got[0][0] and got[0][1] >= released_at
        gate.release()  # idempotent: the worker's finally


def test_a_terminate_holding_the_gate_makes_the_worker_wait_and_a_stuck_holder_times_out():
    run_id = str(uuid.uuid4())
    with terminate_gate(run_id, timeout=1) as held:
        assert held
        with terminate_gate(run_id, timeout=0.3) as second:
            assert not second  # gave up after its timeout: terminate goes on as before the gate
    with terminate_gate(run_id, timeout=1) as again:
        assert again  # released at the end of the block
