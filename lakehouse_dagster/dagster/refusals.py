"""How a step fails in the Dagster UI and console: an expected refusal (bad input, a flip gate, a STOP verdict, a
failed bench gate) shows its reason and no Python stack trace; a transient error is retried; anything else (a bug)
fails loud with its stack.

Why not ``dg.Failure``: Dagster 1.13 serialises a Failure with its own traceback (the framework frames down to the
``raise``), and the UI prints it under "Stack Trace:" (ui-core ``LogsRowStructuredContent``/``FailureContent``: the
outer stack is left out only for a ``USER_CODE_ERROR``, which shows its cause's stack instead); so does the console
(``StepFailureData.error_display_string``). An exception raised by user code is recorded as a ``USER_CODE_ERROR``
whose cause is that exception, and Dagster reads the cause's stack from its ``__traceback__`` attribute
(``traceback.TracebackException``), which ``Refused`` reports as empty. The step then reads
``Error occurred while executing op "...": / Refused: <reason>`` and nothing else, in the UI and the console.

A ``RetryPolicy`` would retry a ``Refused`` (it retries every exception except a Failure with allow_retries=False), so
steps that retry do it through ``fail_step``: ``RetryRequested`` for transient errors only (errors.is_transient).
"""

from __future__ import annotations

from typing import NoReturn

import dagster as dg

from lakehouse_dagster.core.errors import Backpressure, LakehouseError, is_transient

# The retry schedule of the steps that retry (the mirror asset, the ingest op): 5 s, doubling, with jitter, 3 times.
RETRY = dg.RetryPolicy(max_retries=3, delay=5, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)


class Refused(Exception):
    """An expected refusal: the reason is the whole message; nothing was written and a retry changes nothing."""

    @property
    def __traceback__(self):  # what Dagster's error serialiser reads for a cause: no frames to show
        return None

    @__traceback__.setter
    def __traceback__(self, _tb) -> None:  # contextlib re-assigns it while unwinding; the interpreter keeps its own
        pass


def refuse(exc: BaseException | str) -> Refused:
    """The refusal to raise ``from None`` (the reason, without the chained core stack)."""
    return Refused(str(exc))


def fail_step(context, exc: BaseException, retry: dg.RetryPolicy | None = RETRY) -> NoReturn:
    """Raise what the step should end with: G2 backpressure and (with ``retry``) a transient error come back later,
    a LakehouseError is a refusal without a stack, anything else is re-raised as it is (a bug fails loud)."""
    if isinstance(exc, Backpressure):  # G2: the runbook's healthy 503
        raise dg.RetryRequested(max_retries=10, seconds_to_wait=30) from exc
    if retry is not None and is_transient(exc):
        raise dg.RetryRequested(
            max_retries=retry.max_retries, seconds_to_wait=retry.calculate_delay(context.retry_number + 1)
        ) from exc
    if isinstance(exc, LakehouseError):
        raise refuse(exc) from None
    raise exc


def stop(context, message: str, metadata: dict | None = None) -> Refused:
    """A STOP with its evidence: the metadata (tables, counts) goes to the run's log first, since a refusal carries
    text only; raise the result ``from None``."""
    if metadata:
        context.log.info(
            "\n".join(f"{k}: {v.value if isinstance(v, dg.MetadataValue) else v}" for k, v in metadata.items())
        )
    return Refused(message)


def check_errors_line(evaluations, total: int, rest: str = "the other datasets landed") -> str | None:
    """One line naming every dataset whose check ended ERROR in a batch run (mirror or canary), or None when none
    did: the run fails with it after the other datasets have landed (or were checked: ``rest``), so a MISMATCH
    never hides in a green run."""
    failed: dict[str, list[str]] = {}
    for e in evaluations:
        if e.passed or e.severity != dg.AssetCheckSeverity.ERROR:
            continue
        meta = e.metadata or {}
        name = meta.get("dataset_name")
        name = getattr(name, "value", name) or "(unknown dataset)"
        failed.setdefault(f"{name} ({e.partition})", []).append(e.check_name)
    if not failed:
        return None
    shown = "; ".join(f"{ds}: {', '.join(checks)}" for ds, checks in list(failed.items())[:10])
    more = f"; … and {len(failed) - 10} more" if len(failed) > 10 else ""
    return (
        f"{len(failed)} of {total} dataset(s) failed a blocking check: {shown}{more}. "
        f"Each check's result on the dataset's partition says why; {rest}"
    )
