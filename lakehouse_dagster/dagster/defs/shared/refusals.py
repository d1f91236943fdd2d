"""How a step fails in the Dagster UI and console: an expected refusal (bad input, a flip gate, a STOP verdict, a
failed bench gate) shows its reason and no Python stack trace; a transient error is retried; anything else (a bug)
fails loud with its stack.

Where an operator looks, and why an ordinary exception cannot do it in Dagster 1.13:

* the step's row: an exception raised by user code is wrapped in a ``DagsterExecutionStepExecutionError`` whose own
  stack is Dagster's framework frames; the UI (ui-core ``LogsRowStructuredContent``/``FailureContent``) leaves that
  outer stack out only for a ``USER_CODE_ERROR`` with a cause; a ``dg.Failure`` is serialised with its traceback and
  shown under "Stack Trace:";
* the run-level RUN_FAILURE row: Dagster builds it from the first failed step's error
  (``DagsterEvent.job_failure(first_step_failure_event=...)``) but without its error source, so the UI prints that
  outer stack in full, framework frames and all;
* the console: ``StepFailureData.error_display_string``.

So a refusal is raised as the error Dagster forwards from a user code process as it was serialised there
(``dagster.private_apis.dagster_step_error``): one message, ``Refused: <reason>``, no stack and no cause, and since it is
a ``DagsterError`` the op's error boundary lets it through unwrapped and a ``RetryPolicy`` never retries it. The
step's row, the RUN_FAILURE row and the console all read ``Refused: <reason>`` and nothing else.
Steps that retry do it through ``fail_step``: ``RetryRequested`` for transient errors only (errors.is_transient).
"""

from __future__ import annotations

from typing import NoReturn

import dagster as dg

from lakehouse_dagster.core.errors import Backpressure, LakehouseError, is_transient
from lakehouse_dagster.dagster.private_apis import dagster_step_error

# The retry schedule of the steps that retry (the mirror asset, the ingest op): 5 s, doubling, with jitter, 3 times.
RETRY = dg.RetryPolicy(max_retries=3, delay=5, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)

PREFIX = "Refused: "


def refusal(reason: str) -> Exception:
    """An expected refusal: the reason is the whole message; a retry changes nothing."""
    text = str(reason).rstrip("\n")
    if text[: len(PREFIX)].lower() == PREFIX.lower():  # a core message that already says so: "Refused: refused: …"
        text = text[len(PREFIX) :]
    return dagster_step_error(PREFIX + text, "Refused")


def refuse(exc: BaseException | str) -> Exception:
    """The refusal to raise ``from None`` (the reason, without the chained core stack)."""
    return refusal(str(exc))


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


def stop(context, message: str, metadata: dict | None = None) -> Exception:
    """A STOP with its evidence: the metadata (counts; tables are logged row by row where they are built,
    dagster/defs/shared/tables.py) goes to the run's log first, since a refusal carries text only; raise the result ``from None``."""
    shown = {k: v for k, v in (metadata or {}).items() if not isinstance(v, dg.TableMetadataValue)}  # (logged by row)
    if shown:
        context.log.info(
            "\n".join(f"{k}: {v.value if isinstance(v, dg.MetadataValue) else v}" for k, v in shown.items())
        )
    return refusal(message)


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
