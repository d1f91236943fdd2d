"""Parity both ways (issue 31): for a native dataset with the reverse mirror on, Iceberg is authoritative and
``dataset_rows`` is its copy, so the canary's comparison is read the other way round.

  lagging   the reverse position (``lakehouse_reverse_position``) is behind the table's current snapshot: the
            copy is not expected to match yet. Benign.
  ok        the position is the snapshot the canary pinned, and both sides hold the same rows, identity included
            (the reverse mirror keeps ``__row_id``, ``__row_index``, ``__created_at``).
  MISMATCH  caught up and the copy differs. Never a writer rollback (Iceberg is the truth: rolling the writer back
            to pg would make the wrong copy the truth): ``check_reverse_parity`` records it, which alerts, and
            repairs the copy with a full reverse re-sync (``apply_reverse(..., full=True)``).

``reverse_parity`` only compares (parity/canary.py ``evaluate``, pinned the canary's way: Iceberg first, then
Postgres); ``check_reverse_parity`` is the caller that records and acts. The position is read before and after the
comparison: only when both equal the pinned snapshot did the Postgres pin (taken between them) see that snapshot's
rows, since an apply commits the rows and its position together; otherwise the verdict is ``lagging``.

``lakehouse reverse check --dataset <id> [--no-repair]`` runs it (exit 1 on a MISMATCH); so do
``lakehouse canary``, the ``canary`` job and the scheduled canary for every native dataset with the reverse on
(``auto_rollback.run_canary_and_roll_back`` compares those with ``compare_both_ways`` and repairs, never rolls back).
The first native sync's canary keeps its own check (runbooks/first_native_canary.py).
"""

from __future__ import annotations

import dataclasses
import uuid

import psycopg
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.reverse_setting import reverse_settings
from lakehouse_dagster.mirror.reverse import ACTOR, ReverseResult, apply_reverse, position, reverse_states
from lakehouse_dagster.mirror.reverse_lag import reverse_lags
from lakehouse_dagster.parity import canary
from lakehouse_dagster.parity.verdicts import add_to_detail

SOURCE = "reverse canary"


def reverse_parity(
    dsn: str, catalog: Catalog, settings: Settings, dataset_id, *, smoke: bool = False
) -> canary.Verdict | None:
    """The verdict of a native dataset's reverse copy (None: not native, or its reverse is off — the canary's own
    ``native`` verdict applies). Compares only: nothing recorded, nothing repaired."""
    ds_id = parse_uuid(dataset_id, "dataset id")
    with connect(dsn) as conn:
        states = reverse_states(conn, catalog, settings, [ds_id])
        if not states or not states[0].native or not states[0].enabled:
            return None
        before = position(conn, ds_id)
    v = canary.evaluate(dsn, catalog, settings, ds_id, smoke=smoke)
    with connect(dsn) as conn:
        after = position(conn, ds_id)
    held = None if after is None else after.snapshot_id
    v.detail["reverse"] = {"position_before": None if before is None else before.snapshot_id, "position_after": held}
    if v.verdict == canary.ERROR:
        return v
    if v.snapshot_id is None or before is None or before.snapshot_id != v.snapshot_id or held != v.snapshot_id:
        v.verdict = canary.LAGGING
        v.detail["reason"] = (
            f"reverse behind: dataset_rows holds snapshot {held}, Iceberg is at {v.snapshot_id}"
            if held is not None
            else f"reverse behind: it never applied a snapshot, Iceberg is at {v.snapshot_id}"
        ) + f" (lakehouse reverse sync --dataset {ds_id})"
        return v
    # the canary's own ok (the table is still the mirror's snapshot: no native commit yet) or its native verdict
    # that says Postgres holds the same rows, identity included
    same = v.verdict == canary.OK or (
        bool(v.detail.get("agrees_with_postgres")) and not v.detail.get("identity_assigned_anew")
    )
    if same:
        v.verdict = canary.OK
        v.detail["reason"] = (
            f"reverse caught up at snapshot {held}: dataset_rows holds the same rows as Iceberg, identity included"
        )
    else:
        v.verdict = canary.MISMATCH
        v.detail["reason"] = (
            f"reverse caught up at snapshot {held} but dataset_rows differs from Iceberg (Postgres "
            f"{v.pg_count} rows, Iceberg {v.iceberg_count}): the copy is wrong, Iceberg is the truth"
        )
    return v


@dataclasses.dataclass(frozen=True)
class ReverseCheck:
    verdict: canary.Verdict | None
    parity_id: int | None  # the recorded verdict's row (None: not applicable)
    repair: ReverseResult | None  # the full reverse re-sync a MISMATCH asked for
    repair_error: str | None = None

    def line(self) -> str:
        if self.verdict is None:
            return "not a native dataset with the reverse mirror on: the canary's own verdict applies"
        text = f"{self.verdict.verdict}: {self.verdict.detail.get('reason', '')}"
        if self.repair is not None:
            text += f"; repaired, no writer rolled back: {self.repair.summary()}"
        elif self.repair_error:
            text += f"; the full reverse re-sync failed ({self.repair_error}): lakehouse reverse sync --full"
        return text


def check_reverse_parity(
    conn: psycopg.Connection,
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    dataset_id: uuid.UUID,
    *,
    run_id: str | None = None,
    repair: bool = True,
    actor: str | None = None,
) -> ReverseCheck:
    """Compare, record the verdict (a MISMATCH alerts like any recorded one), and on a MISMATCH repair the copy by a
    full reverse re-sync — never ``auto_rollback.after_record``: the writer stays native."""
    v = reverse_parity(dsn, catalog, settings, dataset_id)
    if v is None:
        return ReverseCheck(None, None, None)
    parity_id = canary.record(conn, v, source=SOURCE, run_id=run_id)
    if v.verdict != canary.MISMATCH or not repair:
        return ReverseCheck(v, parity_id, None)
    return repair_copy(conn, dsn, catalog, settings, v, parity_id, actor=actor)


def repair_copy(
    conn: psycopg.Connection,
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    v: canary.Verdict,
    parity_id: int,
    *,
    actor: str | None = None,
) -> ReverseCheck:
    """A recorded reverse MISMATCH's answer: a full reverse re-sync of the copy. What it did goes to the verdict's
    detail (``reverse_repair``) and its row, so the canary's report and the recorded verdict both say it."""
    try:
        fixed = apply_reverse(dsn, catalog, settings, v.dataset_id, full=True, actor=actor or ACTOR)
        out = ReverseCheck(v, parity_id, fixed)
        said = f"repaired by a full reverse re-sync, no writer rolled back: {fixed.summary()}"
    except Exception as exc:  # noqa: BLE001 - recorded and said; the next check asks again
        out = ReverseCheck(v, parity_id, None, f"{type(exc).__name__}: {exc}")
        said = f"the full reverse re-sync failed ({out.repair_error}): lakehouse reverse sync --full"
    v.detail["reverse_repair"] = said
    add_to_detail(conn, parity_id, "reverse_repair", said)
    return out


def both_ways_dataset_ids(conn: psycopg.Connection) -> set[uuid.UUID]:
    """The native datasets whose reverse mirror is on: their canary compares both ways (two queries)."""
    native = native_dataset_ids(conn)
    return {d for d, s in reverse_settings(conn, native).items() if s.enabled}


def catch_up(
    conn: psycopg.Connection, dsn: str, catalog: Catalog, settings: Settings, dataset_ids: list[uuid.UUID]
) -> dict[uuid.UUID, float]:
    """For a writer rollout's analysis: how far behind each dataset's reverse mirror was (seconds; 0 caught up),
    then apply what it had not, so the canary after it checks parity both ways at the current snapshot. The lag
    before is the evidence about the reverse's driver (the stream, the sensor); an apply that fails is left to the
    canary, which then says lagging."""
    lags, _off = reverse_lags(conn, native_dataset_ids(conn, dataset_ids))
    for ds_id, lag in lags.items():
        if not lag.caught_up or lag.applied_snapshot is None:  # (no position yet: an apply records it)
            try:
                apply_reverse(dsn, catalog, settings, ds_id)
            except Exception:  # noqa: BLE001 - the canary says lagging, with the lag the analysis gates on
                pass
    return {d: lag.lag_seconds or 0.0 for d, lag in lags.items()}


def is_reverse_verdict(v: canary.Verdict) -> bool:
    """A verdict ``reverse_parity`` gave (Iceberg the truth, dataset_rows the copy)."""
    return "reverse" in v.detail
