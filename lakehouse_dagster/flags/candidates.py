"""Write-flip candidate selection (step 2b of the Fase 4 runbook), with what each candidate still lacks.

The runbook classifies identity-ready datasets as SAFE or BLOCKED (pipeline input) with one
read-only query; it runs here verbatim (test_demo compares it with the runbook character for
character). The reverse mirror (issue 31) then reclassifies a pipeline input: its dataset_rows stay
fresh while the reverse mirror is on for it, so it is ``SAFE (pipeline input; reverse mirror on)``, and
BLOCKED, naming why and the command that lifts it, only while its reverse mirror is off (or cannot
run: capture mode after-commit before PostgreSQL 14, tracking/capture.reverse_blocked). The query's own verdict is kept as ``runbook_verdict``. SAFE only says "no pipeline reads it from dataset_rows": the flip gates (gates.py) also
ask that its readers are on Iceberg, that it is caught up and that its parity verdict is ok, so each
candidate carries the gate's reasons for the chosen writer, and ``ready`` means a
``write-flags flip <writer> --dataset <id>`` would get past the gates now (the CLI suggests the flip, the runbook's
step 3, not a bare set: the flip also canaries, verifies, runs the first native sync and its canary).
"""

from __future__ import annotations

import dataclasses
import uuid

import psycopg

from lakehouse_dagster.flags.gates import NATIVE, REVERSE_ON, Effect, write_flip_blockers
from lakehouse_dagster.flags.registry import WRITE, check_mode, get_flag
from lakehouse_dagster.flags.reverse_setting import reverse_settings
from lakehouse_dagster.flags.stored import resolve_for, stored_overrides
from lakehouse_dagster.tracking import capture
from lakehouse_dagster.tracking.datasets import lookup

# Step 2b of the writer-flip runbook (the team's document, kept outside this repository), verbatim.
RUNBOOK_SAFE_BLOCKED = """\
with latest as (
  select distinct on (dataset_id) dataset_id, status, has_identity
  from iceberg_sync_log order by dataset_id, finished_at desc nulls last),
pin as (   -- datasets referenced as a pipeline INPUT (a `dataset` spec node)
  select distinct (node->'data'->>'datasetId')::uuid as dataset_id
  from pipelines, jsonb_array_elements(spec->'nodes') node
  where node->>'type' = 'dataset'
    and (node->'data'->>'datasetId') ~ '^[0-9a-fA-F-]{36}$')
select case when p.dataset_id is not null then 'BLOCKED (pipeline input)' else 'SAFE' end as verdict,
       d.name, d.row_count, d.id
from latest l
join datasets d on d.id = l.dataset_id
left join pin p on p.dataset_id = l.dataset_id
where l.status = 'succeeded' and l.has_identity
order by verdict, d.row_count desc nulls last;"""

SAFE = "SAFE"
RUNBOOK_BLOCKED = "BLOCKED (pipeline input)"  # the query's verdict for a pipeline input
SAFE_REVERSE = "SAFE (pipeline input; reverse mirror on)"


def reverse_verdict(
    runbook_verdict: str, dataset_id: uuid.UUID, reverse_on: bool, cannot_run: str | None = None
) -> str:
    """Step 2b's verdict with the reverse mirror: a pipeline input is SAFE while its reverse mirror is on (and can
    run: ``cannot_run`` is ``capture.reverse_blocked``'s reason)."""
    if runbook_verdict != RUNBOOK_BLOCKED:
        return runbook_verdict
    if reverse_on and not cannot_run:
        return SAFE_REVERSE
    if reverse_on:
        return f"BLOCKED (pipeline input; reverse mirror on but it cannot run: {cannot_run})"
    return f"BLOCKED (pipeline input; reverse mirror off: turn it on with `{REVERSE_ON.format(id=dataset_id)}`)"


@dataclasses.dataclass(frozen=True)
class Candidate:
    verdict: str  # SAFE | SAFE (pipeline input; reverse mirror on) | BLOCKED (pipeline input; reverse mirror off: ...)
    name: str
    row_count: int | None
    dataset_id: uuid.UUID
    writer_mode: str  # the writer's effective mode for the dataset now
    ready: bool  # the flip gates would let the writer go iceberg_native for it now
    reasons: tuple[str, ...]
    runbook_verdict: str = SAFE  # the runbook's query verbatim: SAFE | BLOCKED (pipeline input)
    reverse: str | None = None  # a pipeline input's reverse setting (e.g. "reverse on (the default)")

    @property
    def safe(self) -> bool:
        return self.verdict.startswith(SAFE)

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dataset_id": str(self.dataset_id), "reasons": list(self.reasons)}


def write_flip_candidates(conn: psycopg.Connection, writer: str = "sync.full") -> list[Candidate]:
    flag = get_flag(WRITE, writer)
    check_mode(flag, NATIVE)  # a writer locked to pg has no candidates: say so
    with conn.cursor() as cur:
        cur.execute(RUNBOOK_SAFE_BLOCKED.encode())  # bytes: executed exactly as written, no placeholders
        rows = cur.fetchall()
    if not rows:
        return []
    ids = [r[3] for r in rows]
    info = lookup.infos_of(conn, ids)
    stored = stored_overrides(conn, WRITE, [writer])[writer]
    modes = {i: resolve_for(flag, stored, i, info[i][2]) for i in ids}
    moved = [Effect(i, info[i][1], modes[i], NATIVE) for i in ids if modes[i] != NATIVE]
    reasons = {b.dataset_id: b.reasons for b in write_flip_blockers(conn, moved, info)}
    piped = [r[3] for r in rows if r[0] == RUNBOOK_BLOCKED]
    reverse = reverse_settings(conn, piped)
    cannot_run = capture.reverse_blocked(conn) if piped else None
    out = []
    for runbook, name, row_count, ds_id in rows:
        why = reasons.get(ds_id, ())
        if modes[ds_id] == NATIVE:
            why = (f"already {NATIVE} for {writer}",)
        s = reverse.get(ds_id)
        verdict = reverse_verdict(runbook, ds_id, s is not None and s.enabled, cannot_run)
        c = Candidate(
            verdict,
            name,
            row_count,
            ds_id,
            modes[ds_id],
            False,
            tuple(why),
            runbook,
            s.describe() if s is not None else None,
        )
        out.append(dataclasses.replace(c, ready=c.safe and not reasons.get(ds_id) and modes[ds_id] != NATIVE))
    # the runbook's order (verdict, then row_count desc nulls last), over the verdicts as reclassified
    return sorted(out, key=lambda c: (c.verdict, c.row_count is None, -(c.row_count or 0)))
