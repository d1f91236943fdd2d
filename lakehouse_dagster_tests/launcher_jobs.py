"""Small jobs for test_launcher.py: a code location the warm launcher's workers load after their fork."""

import importlib
import time

import dagster as dg


@dg.op
def ok_op() -> int:
    return 1


@dg.op
def fail_op():
    raise RuntimeError("this op fails on purpose")


@dg.op
def sleep_op():
    for _ in range(1200):  # 2 min at most; interrupted by terminate/SIGKILL in the tests
        time.sleep(0.1)


@dg.op
def probe_op(context: dg.OpExecutionContext):
    """Reports PROBE_VALUE of the module ``launcher_probe`` as imported by this run (a code change test)."""
    probe = importlib.import_module("launcher_probe")
    context.log_event(dg.AssetObservation(asset_key="launcher_probe", metadata={"probe": probe.PROBE_VALUE}))


@dg.op
def chatty_op(context: dg.OpExecutionContext):
    """Logs CHATTY lines: each is an event the instance stores (test_launcher.py counts their connections)."""
    for k in range(CHATTY):
        context.log.info(f"line {k}")


CHATTY = 30


@dg.job(executor_def=dg.in_process_executor)
def ok_job():
    ok_op()


@dg.job(executor_def=dg.in_process_executor)
def chatty_job():
    chatty_op()


@dg.job(executor_def=dg.in_process_executor)
def fail_job():
    fail_op()


@dg.job(executor_def=dg.in_process_executor)
def sleep_job():
    sleep_op()


@dg.job(executor_def=dg.in_process_executor)
def probe_job():
    probe_op()


defs = dg.Definitions(jobs=[ok_job, fail_job, sleep_job, probe_job, chatty_job])


def exit_3_unless_definitions_are_preloaded():
    """Run in a child of the warm forkserver (test_launcher.py): the real location's ``defs()`` returns the
    Definitions the forkserver built, without building them again."""
    import sys

    from lakehouse_dagster.dagster.definitions import defs
    from lakehouse_dagster.dagster.launcher import location

    built = defs()
    sys.exit(0 if built is not None and built is location.preloaded() else 3)
