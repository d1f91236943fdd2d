"""Why a run failed, in the words an operator reads: the one definition the alerts sensor (a failed run's message)
and the rollout controller (a failed step's reason in the plan's event) both use."""

from __future__ import annotations

import dagster as dg

# How a refused step's error reads (refusals.py): "Refused: <reason>", or with the class's full name.
_REFUSED = ("lakehouse_dagster.dagster.defs.shared.refusals.Refused: ", "Refused: ")


def failure_reason(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """The first failed step's error (a refusal's reason, without its exception name), else the run's own failure
    message; None when the run recorded neither."""
    for record in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_FAILURE).records:
        event = record.event_log_entry.dagster_event
        data = event.step_failure_data if event is not None else None
        if data is None or data.error is None:
            continue
        text = (data.error.cause or data.error).message.strip()
        prefix = next((p for p in _REFUSED if text.startswith(p)), "")
        return text[len(prefix) :].strip() or None
    for record in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records:
        entry = record.event_log_entry
        text = (entry.user_message or (entry.dagster_event.message if entry.dagster_event else "") or "").strip()
        return text or None
    return None
