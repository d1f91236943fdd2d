"""mirror_stream: one shard of the datasets mirrored as it changes, by one run that lives a bounded time (the loop:
mirror/stream.py; the mirror_poller sensor keeps one alive per shard and starts its successor before it ends).

Each sync the loop makes is logged at once as the materializations of its dataset's postgres/dataset_rows and
iceberg/dataset_table partitions, with the metadata mirror_batch_job logs (the same function). The partition's
checks (parity, snapshot_freshness, identity_ready) are evaluated the way mirror_batch_job evaluates them
(``check_evaluations``), but when the loop is idle, newest sync first once per dataset: a burst syncs everything
before it checks anything, and a dataset synced five times in a second is checked once, after its last sync. The
loop's background table maintenance (mirror/stream_maintenance.py) is logged in one line per round that compacted
files or expired snapshots, and nothing for a round that did nothing. A
sync that failed, or a blocking check that ended ERROR, is logged when it happens and fails the run at its end
(the alerts sensor posts it; the successor has taken the shard over by then).

The loop also applies the native commits of the shard's datasets back to dataset_rows (the reverse mirror): each
apply is a materialization of the dataset's postgres/dataset_rows partition naming the snapshot applied
(reverse_job.py ``reverse_materialization``, the same as a reverse_mirror_job run logs); a failed apply is logged
when it happens (the loop tries it again after a backoff) and fails the run at its end, as a failed sync does.
"""

import contextlib
import signal
import threading
import time
import uuid

import dagster as dg
import psycopg

from lakehouse_dagster.api.mirror import (
    Failed,
    Idle,
    Maintained,
    ReverseApplied,
    ReverseFailed,
    Stopped,
    check_shard,
    stream_shard,
)
from lakehouse_dagster.api.parity import wedged_syncs
from lakehouse_dagster.core.errors import postgres_unreachable
from lakehouse_dagster.dagster.defs.mirror.mirror_batch import dataset_name_of, synced_materializations
from lakehouse_dagster.dagster.defs.mirror.reverse_job import reverse_materialization
from lakehouse_dagster.dagster.defs.parity.checks import check_evaluations
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.partitions import DATASETS
from lakehouse_dagster.dagster.defs.shared.provenance import with_table_provenance
from lakehouse_dagster.dagster.defs.shared.refusals import check_errors_line, refuse
from lakehouse_dagster.dagster.launcher.event_writes import pooled_event_writes
from lakehouse_dagster.dagster.private_apis import dagster_log_now

SHARD_TAG = "lakehouse/stream_shard"  # "<shard>/<shard count>" on every mirror_stream run (the supervisor's filter)
GENERATION_TAG = "lakehouse/stream_generation"


class MirrorStreamConfig(dg.Config):
    """Which shard (0 to shards - 1) of how many, and for how long (0: LAKEHOUSE_MIRROR_STREAM_LIFETIME_SECONDS)."""

    shard: int = 0
    shards: int = 1
    lifetime_seconds: int = 0


@dg.op(
    out={},
    description="Mirror one shard of the datasets as they change, for the run's lifetime (mirror/stream.py); every "
    "sync is a materialization of the dataset's iceberg/dataset_table partition, checked when the stream is idle.",
)
def stream_shard_op(context: dg.OpExecutionContext, config: MirrorStreamConfig, lakehouse: LakehouseResource):  # noqa: C901
    """Long on purpose: what the loop yields (a sync, a failure, a maintenance round, an idle moment, a stop) is
    logged in one dispatch, in the order the loop yields it; the checks' bookkeeping lives beside it. Events are
    logged at once (``dagster_log_now``), not yielded: a yielded event stays in the step's memory until the run ends."""
    check_shard(config.shard, config.shards)
    settings = lakehouse.settings()
    lifetime = config.lifetime_seconds or settings.stream.lifetime_seconds
    deadline = time.time() + lifetime
    known = set(context.instance.get_dynamic_partitions(DATASETS))
    to_check: dict[uuid.UUID, None] = {}  # synced and not checked since, oldest first
    synced: set[uuid.UUID] = set()
    failed = 0
    failures: list[str] = []
    reversed_: set[uuid.UUID] = set()
    reverse_failures: list[str] = []
    logged: list[dg.AssetCheckEvaluation] = []
    context.log.info(f"streaming shard {config.shard} of {config.shards} for {lifetime}s")

    def checks(session: _Session, ds_id: uuid.UUID) -> list[dg.AssetCheckEvaluation]:
        try:
            conn = session.conn()
            wedged = {w["dataset_id"] for w in wedged_syncs(conn, settings.mirror.wedged_after_seconds)}
            evaluations = check_evaluations(
                lakehouse,
                str(ds_id),
                run_id=context.run_id,
                log=context.log,
                instance=context.instance,
                conn=conn,
                wedged=wedged,
            )
        except Exception as exc:
            lost = postgres_unreachable(exc)  # psycopg's, or SQLAlchemy's (the catalog's) raised from it
            if lost is None:
                raise
            session.close()  # Postgres went away mid-check: nothing is recorded as passed
            context.log.warning(f"checks of {ds_id} not evaluated: {lost} (the partition's next sync is checked)")
            return []
        if signalled.is_set():  # a signal came mid-check: what it saw (a query cancelled) is not a verdict
            context.log.info(
                f"checks of {ds_id} not recorded: the run is stopping (the partition's next sync is checked)"
            )
            return []
        logged.extend(e for e in evaluations if not e.passed)
        return evaluations

    def events_of(ds_id: uuid.UUID, what: str, read) -> list:
        """``read(conn)``'s events; none, said in one line, when Postgres goes away mid-read (a restart between the
        session's ping and its use): the sync landed, its page waits for the next one, and the stream's own
        stopping line follows — never a stack trace that fails the run."""
        try:
            return read(session.conn())
        except Exception as exc:
            lost = postgres_unreachable(exc)
            if lost is None:
                raise
            session.close()
            context.log.warning(f"{what} of {ds_id} not recorded: {lost} (the partition's next sync records it)")
            return []

    stopping = False  # the stack is stopping: a signal to the run's process, no termination asked
    stop = threading.Event()  # the loop's: set at its end, or by a signal
    signalled = threading.Event()  # a signal to the run's process came, whatever a library did with its exception
    with (
        pooled_event_writes(context.instance),
        contextlib.closing(_Session(lakehouse)) as session,
        _signals_stop(stop, signalled),
    ):
        items = stream_shard(
            lakehouse.pg_dsn,
            lakehouse.catalog(),
            settings,
            shard=config.shard,
            shard_count=config.shards,
            run_id=context.run_id,
            deadline=deadline,
            stop=stop,
        )
        try:
            for item in items:
                if isinstance(item, Maintained):  # a background round the loop started in an idle moment ended
                    line = item.line()  # nothing when it did nothing
                    if line is not None:
                        name = session.name_of(item.dataset_id)
                        (context.log.warning if item.error else context.log.info)(f"{name}: {line}")
                    continue
                if isinstance(item, Idle):
                    if to_check:  # one dataset per idle moment: a change arriving meanwhile waits for one check
                        ds_id = next(iter(to_check))
                        del to_check[ds_id]
                        dagster_log_now(context, checks(session, ds_id))
                    continue
                if isinstance(item, Stopped):
                    context.log.warning(
                        f"shard {config.shard} of {config.shards}: stopping before the deadline: {item.reason}; the "
                        "mirror_poller sensor starts its successor once Postgres answers"
                    )
                    continue
                if isinstance(item, ReverseApplied):
                    reversed_.add(item.dataset_id)
                    key = str(item.dataset_id)
                    if key not in known:
                        context.instance.add_dynamic_partitions(DATASETS, [key])
                        known.add(key)
                    result = item.result
                    dagster_log_now(
                        context,
                        events_of(
                            item.dataset_id,
                            "the reverse apply's materialization",
                            lambda conn: [e for e in [reverse_materialization(conn, result, context.log)] if e],
                        ),
                    )
                    continue
                if isinstance(item, ReverseFailed):
                    name = session.name_of(item.dataset_id)
                    reverse_failures.append(f"{name} ({item.dataset_id}): {item.error}")
                    context.log.error(
                        f"{name} ({item.dataset_id}): reverse apply failed (attempt {item.attempts}, nothing "
                        f"half-applied): {item.error}; tried again in {item.retry_in:.0f}s"
                    )
                    continue
                if isinstance(item, Failed):
                    failed += 1
                    name = session.name_of(item.dataset_id)
                    failures.append(f"{name} ({item.dataset_id}): {item.error}")
                    context.log.error(f"{name} ({item.dataset_id}) failed: {item.error}")
                    continue
                synced.add(item.dataset_id)
                key = str(item.dataset_id)
                if key not in known:  # a dataset the stream met first: its partition, before its materialization
                    context.instance.add_dynamic_partitions(DATASETS, [key])
                    known.add(key)
                done = item
                events = events_of(
                    item.dataset_id,
                    "the sync's materializations",
                    lambda conn: synced_materializations(conn, settings, done, context.log, context.instance),
                )
                dagster_log_now(context, with_table_provenance(context.instance, events))
                to_check.pop(item.dataset_id, None)
                to_check[item.dataset_id] = None
        except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt):
            # SIGTERM/SIGINT to the run's process: a user's Terminate (the run is CANCELING: Dagster records the
            # cancel), or its stack stopping (`lakehouse up`'s Ctrl-C, a code server or a pod going away). That one
            # ends the stream as its deadline does, a hand-over: the syncs in flight land, the lock is released
            # and the next poller's successor takes the shard; a normal stop leaves no failed run behind.
            items.close()
            if _termination_requested(context):
                raise
            stopping = True
        finally:
            items.close()  # the loop stops and waits for its syncs in flight (each one commit), then lets go
        if signalled.is_set() and not stopping:  # a signal whose exception a library swallowed: the loop stopped
            if _termination_requested(context):
                raise dg.DagsterExecutionInterruptedError()
            stopping = True
        if not stopping:  # stopping, the checks left are the next sync's: the stop stays within seconds
            for ds_id in list(to_check):  # the shard is the successor's now: only the checks are left
                dagster_log_now(context, checks(session, ds_id))
    context.log.info(
        f"shard {config.shard} of {config.shards}: "
        + ("stopped with its process (the stack is stopping), handed over; " if stopping else "")
        + f"{len(synced)} datasets mirrored, {failed} syncs failed; "
        f"{len(reversed_)} native datasets reverse-applied, {len(reverse_failures)} reverse applies failed"
    )
    problems = []
    if failures:
        problems.append(
            f"{len(failures)} syncs failed ({'; '.join(failures[:5])}); the others landed, and the stream "
            "asks for the failed ones again after the poller's backoff"
        )
    if reverse_failures:
        problems.append(
            f"{len(reverse_failures)} reverse applies failed ({'; '.join(reverse_failures[:5])}); each left "
            "dataset_rows as of its last whole snapshot, and the stream tries it again after a backoff"
        )
    line = check_errors_line(logged, len(synced))
    if line:
        problems.append(line)
    if problems:
        raise refuse("\n".join(problems)) from None


@contextlib.contextmanager
def _signals_stop(stop: threading.Event, signalled: threading.Event):
    """Within the block, SIGTERM and SIGINT set ``stop`` and ``signalled`` before Dagster's own handler raises its interrupt: a library
    that swallows the exception (DuckDB turns it into RuntimeError('Query interrupted'); the canary makes any error an
    ERROR verdict) cannot keep the stream running past its stack's stop (issue 44: a code server's SIGTERM ignored
    until the SIGKILL 30 s later). Only the main thread may set handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum, frame) -> None:
        handler = previous[signum]
        if handler == signal.SIG_IGN:  # a signal this process was told to ignore stops nothing
            return
        signalled.set()
        stop.set()
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:
            raise KeyboardInterrupt

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _termination_requested(context: dg.OpExecutionContext) -> bool:
    """A user (or run monitoring) asked Dagster to end the run: its status says so before the signal is sent."""
    run = context.instance.get_run_by_id(context.run_id)
    return run is not None and run.status in (dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED)


class _Session:
    """The run's own Postgres session, opened again when a restart or a dropped connection ended it: the stream
    itself stops then (its shard may be another run's), but what it synced before is still logged and checked."""

    def __init__(self, lakehouse: LakehouseResource):
        self._lakehouse = lakehouse
        self._conn: psycopg.Connection | None = None

    def conn(self) -> psycopg.Connection:
        """A live session: pinged first (a session a restart ended looks open until it is used), as
        SQLAlchemy's pool_pre_ping does; a local round trip costs well under a millisecond per use."""
        if self._conn is not None:
            try:
                self._conn.execute("select 1")
            except psycopg.OperationalError:
                self.close()
        if self._conn is None:
            self._conn = self._lakehouse.connect()
        return self._conn

    def name_of(self, dataset_id: uuid.UUID) -> str:
        """The dataset's name for a failure's line; its id when Postgres cannot say (the failure is the news)."""
        try:
            return dataset_name_of(self.conn(), dataset_id)
        except psycopg.OperationalError:
            self.close()
            return str(dataset_id)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # a dead session: nothing to close cleanly
                self._conn.close()
            self._conn = None


@dg.job(
    executor_def=dg.in_process_executor,
    description="Mirror one shard of the datasets as they change, for a bounded time (started and handed over by "
    "the mirror_poller sensor when LAKEHOUSE_MIRROR_STREAM is on).",
)
def mirror_stream():
    stream_shard_op()
