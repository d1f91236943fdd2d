"""The migration overview: where every tabular dataset stands for each reader and writer, the latest verdicts, what
is behind the mirror, and the datasets that need an operator (the Dagster asset ``lakehouse/migration_overview`` and
``lakehouse status`` print this one computation).

Stages, per flag and dataset (a flag's stages add up to the number of tabular datasets):

* reader: ``postgres`` while Iceberg has no succeeded snapshot of the dataset (whatever the flag: the freshness gate
  serves Postgres, the flip is inert), then ``iceberg_only`` (effective mode iceberg_only), ``reads_iceberg`` (mode
  iceberg: Iceberg when the gate passes, Postgres as fallback) or ``mirrored`` (off or shadow);
* writer: ``native`` (mode iceberg_native), ``blocked`` (step 2b of the Fase 4 runbook says BLOCKED (pipeline
  input), F3, and its reverse mirror is off: blocked now; with it on a pipeline input is SAFE, flags/candidates.py),
  otherwise ``mirrored`` or ``postgres`` as for readers.

A dataset's own stage is the furthest any flag took it: ``native`` (a writer is native) > ``reads_iceberg`` (a
reader is on iceberg or iceberg_only) > ``mirrored`` > ``postgres``; ``blocked`` counts the datasets the runbook
blocks now (pipeline inputs with the reverse mirror off) among those not native, whatever their stage. A native
dataset with the reverse mirror on has its reverse lag (mirror/reverse_lag.py: the native commits not yet applied
to dataset_rows, and since when). Only the readers Iceberg can serve and the
writers that can go native are counted: the others are locked to Postgres and never move.

**Held on Postgres** (issue 43): per dataset, what still reads it from ``dataset_rows`` and so keeps it from
``complete`` — the pipelines reading it as input and the declared readers whose mode for it serves Postgres
(runbooks/complete.py's consumer condition, from the same two sources: ``pipeline_input_dataset_ids`` and
flags/reader_datasets.py ``on_postgres``); a compute reader with its shadow proof (flags/proof.py). **Shadow
consistency** per compute reader: the datasets compared against their current schema, the proven ones, and the
pooled rate — computed at each refresh, so as fresh as the overview (the partition page is not: it changes only on
what the recorder watches, and shadow comparisons are not among its streams).

Effective modes come from the flags' one precedence definition (flags/precedence.py), verdicts from
parity/verdicts.py, behind and lag from status/lag.py, wedged syncs from parity.verdicts.wedged_syncs, native-unsafe
datasets from routing/native_guard.py, the mirror stream's shards from mirror/shards.py ``shard_status`` (the one
definition the ``stream_down`` alert reads too). A bounded number of queries whatever the number of datasets and
shards (docs/overview.md has the figure at 10,000).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
import uuid

import psycopg

from lakehouse_dagster import lifecycle
from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.gates import REVERSE_ON
from lakehouse_dagster.flags.incidents import fallbacks_in_window
from lakehouse_dagster.flags.lifecycle_facts import lifecycle_of
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.precedence import effective_sql
from lakehouse_dagster.flags.proof import Threshold, proofs, threshold
from lakehouse_dagster.flags.registry import FLIPPABLE_WRITERS, PROVEN_READERS, READ, SERVABLE_READERS, WRITE
from lakehouse_dagster.flags.reverse_setting import reverse_settings
from lakehouse_dagster.mirror.reverse_lag import ReverseLag, reverse_lags
from lakehouse_dagster.mirror.shards import shard_status
from lakehouse_dagster.parity import verdicts as parity_verdicts
from lakehouse_dagster.routing.native_guard import native_blockers
from lakehouse_dagster.status.held import (  # noqa: F401 - HOLDERS, Held, ShadowSummary: importable from here too
    HOLDERS,
    PIPELINE_INPUT,
    Held,
    ShadowSummary,
    held_on_postgres,
    pipelines_reading,
    shadow_summaries,
)
from lakehouse_dagster.status.lag import behind_datasets, lagging_past
from lakehouse_dagster.tracking import capture, sync_log
from lakehouse_dagster.tracking import datasets as app_tables
from lakehouse_dagster.tracking.datasets import fragments, scopes
from lakehouse_dagster.tracking.datasets.rows import TABLE as ROWS_TABLE

POSTGRES, MIRRORED, READS_ICEBERG, ICEBERG_ONLY, NATIVE, BLOCKED = (
    "postgres",
    "mirrored",
    "reads_iceberg",
    "iceberg_only",
    "native",
    "blocked",
)
STAGES = {READ: (POSTGRES, MIRRORED, READS_ICEBERG, ICEBERG_ONLY), WRITE: (POSTGRES, MIRRORED, BLOCKED, NATIVE)}
DATASET_STAGES = (POSTGRES, MIRRORED, READS_ICEBERG, NATIVE)
FLAGS = (*SERVABLE_READERS, *FLIPPABLE_WRITERS)
UNCHECKED = "unchecked"  # no verdict recorded yet
VERDICTS = (*parity_verdicts.VERDICTS, UNCHECKED)

# What needs an operator, most urgent first (a dataset with several is listed once, under its most urgent).
MISMATCH, NATIVE_UNSAFE, CHECK_ERROR, WEDGED, LAGGING = "MISMATCH", "native-unsafe", "check error", "wedged", "lagging"
FALLBACK = "read fallback"  # a reader fell back to Postgres within FALLBACK_WINDOW_SECONDS (in process or the app's)
PROBLEMS = (MISMATCH, NATIVE_UNSAFE, CHECK_ERROR, WEDGED, LAGGING, FALLBACK, BLOCKED)
FALLBACK_WINDOW_SECONDS = 86_400  # the read fallbacks the overview counts: the last day's
ATTENTION_SHOWN = 100  # rows of the attention list kept (the counts per problem are complete)

_EFFECTIVE, _ = effective_sql(FLAGS, scopes.TABULAR_IDS_AND_WORKSPACES, select="e.dataset_id, e.kind, e.name, e.mode")
_STAGES = f"""
with e as ({_EFFECTIVE}),
     m as materialized ({fragments.mirrored_and_blocked(sync_log.EVER_SUCCEEDED)}),
     s as (
       select e.dataset_id, e.kind, e.name,
              case when e.kind = 'write' then
                     case when e.mode = 'iceberg_native' then 'native'
                          when m.blocked then 'blocked'
                          when m.mirrored then 'mirrored' else 'postgres' end
                   when not m.mirrored then 'postgres'
                   when e.mode = 'iceberg_only' then 'iceberg_only'
                   when e.mode = 'iceberg' then 'reads_iceberg'
                   else 'mirrored' end as stage
         from e join m on m.id = e.dataset_id)
select kind, name, stage, count(*) from s group by kind, name, stage
union all
select null, null, stage, count(*) from (
  select case when bool_or(stage = 'native') then 'native'
              when bool_or(stage in ('reads_iceberg', 'iceberg_only')) then 'reads_iceberg'
              when bool_or(stage in ('mirrored', 'blocked')) then 'mirrored'
              else 'postgres' end as stage
    from s group by dataset_id) x
 group by stage
"""


@dataclasses.dataclass(frozen=True)
class Attention:
    """A dataset that needs an operator: its most urgent problem, every problem it has, and why."""

    dataset_id: uuid.UUID
    name: str
    workspace_id: uuid.UUID | None
    workspace: str | None
    problem: str
    problems: tuple[str, ...]
    reason: str

    def as_dict(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "dataset_id": str(self.dataset_id),
            "workspace_id": None if self.workspace_id is None else str(self.workspace_id),
            "problems": list(self.problems),
        }


@dataclasses.dataclass(frozen=True)
class Overview:
    computed_at: dt.datetime
    seconds: float
    datasets: int  # tabular datasets
    dataset_stages: dict[str, int]  # DATASET_STAGES → count (they add up to ``datasets``)
    blocked: int  # not native, the runbook's step 2b says BLOCKED (pipeline input), and its reverse is off now
    flag_stages: dict[tuple[str, str], dict[str, int]]  # (kind, name) → STAGES[kind] → count
    verdicts: dict[str, int]  # VERDICTS → count (the latest verdict of each dataset)
    wedged: int
    behind: int  # datasets behind the mirror (status/lag.py), never-synced ones included
    never_synced: int
    lagging: int  # behind with a lag past ``lag_threshold_seconds``
    max_lag_seconds: float | None  # the largest lag among the behind datasets (None: none behind with a lag)
    lag_threshold_seconds: int
    native: int  # datasets written iceberg-native
    native_unsafe: int  # of those, the ones failing the write-flip gates that still apply to them
    problems: dict[str, int]  # PROBLEMS → datasets with that problem (a dataset may count under several)
    attention: list[Attention]  # at most ATTENTION_SHOWN, most urgent first
    attention_total: int  # datasets that need attention, all of them
    fallbacks: dict[str, int] = dataclasses.field(default_factory=dict)  # reader → fallbacks in the window
    # the mirror stream's shards (mirror/shards.py ``shard_status``): on, shard_count, down_after_s, shards
    stream: dict = dataclasses.field(default_factory=lambda: {"on": False, "shards": []})
    piped_reverse_on: int = 0  # pipeline inputs the reverse mirror unblocks (SAFE with it on; not counted blocked)
    reverse_on: int = 0  # native datasets with the reverse mirror on
    reverse_off: int = 0  # native datasets with it off (a rollback needs a backfill)
    reverse_behind: int = 0  # of reverse_on, those with native commits not yet applied to dataset_rows
    reverse_max_lag_seconds: float | None = None  # the largest reverse lag (None: none behind)
    reverse_lags: list[ReverseLag] = dataclasses.field(default_factory=list)  # the behind ones, largest lag first
    lifecycle: dict[str, int] = dataclasses.field(default_factory=dict)  # lifecycle state → tabular datasets
    blocked_names: list[str] = dataclasses.field(default_factory=list)  # the blocked datasets' names, sorted
    held: list[Held] = dataclasses.field(default_factory=list)  # at most ATTENTION_SHOWN, nearest complete first
    held_total: int = 0  # datasets held on Postgres, all of them
    held_by: dict[str, int] = dataclasses.field(default_factory=dict)  # HOLDERS → datasets it holds
    shadow: list[ShadowSummary] = dataclasses.field(default_factory=list)  # one per compute reader
    threshold: Threshold | None = None  # the comparisons in a row a flip needs, and where that comes from

    def as_dict(self) -> dict:
        return {
            "computed_at": self.computed_at.isoformat(),
            "seconds": self.seconds,
            "datasets": self.datasets,
            "dataset_stages": self.dataset_stages,
            "lifecycle": self.lifecycle,
            "blocked": self.blocked,
            "blocked_names": self.blocked_names,
            "flags": [
                {"kind": kind, "name": name, "stages": stages} for (kind, name), stages in self.flag_stages.items()
            ],
            "verdicts": self.verdicts,
            "wedged": self.wedged,
            "behind": self.behind,
            "never_synced": self.never_synced,
            "lagging": self.lagging,
            "max_lag_seconds": self.max_lag_seconds,
            "lag_threshold_seconds": self.lag_threshold_seconds,
            "native": self.native,
            "native_unsafe": self.native_unsafe,
            "problems": self.problems,
            "attention": [a.as_dict() for a in self.attention],
            "attention_total": self.attention_total,
            "fallbacks": self.fallbacks,
            "mirror_stream": self.stream,
            "reverse": {
                "piped_reverse_on": self.piped_reverse_on,
                "on": self.reverse_on,
                "off": self.reverse_off,
                "behind": self.reverse_behind,
                "max_lag_seconds": self.reverse_max_lag_seconds,
                "lags": [r.as_dict() for r in self.reverse_lags],
            },
            "held_on_postgres": {
                "total": self.held_total,
                "by": self.held_by,
                "datasets": [h.as_dict() for h in self.held],
            },
            "shadow": [x.as_dict() for x in self.shadow],
            "shadow_proof_reads": self.threshold.as_dict() if self.threshold else None,
        }


# Step 2b's classification, asked per pipeline input: its `pin` CTE verbatim, then each input's latest sync (the
# runbook's order: finished_at desc nulls last) through iceberg_sync_log_dataset_idx, instead of its `distinct on`
# over the whole sync log (5 ms against 0.43 s at 200,000 log rows; test_overview compares the two on its mix).
_BLOCKED = (
    """
with pin as (   -- datasets referenced as a pipeline INPUT (a `dataset` spec node)
  """
    + app_tables.PIN
    + """)
select p.dataset_id
  from pin p
  """
    + fragments.JOIN_DATASET_D_OF_P
    + """
 cross join lateral """
    + sync_log.LATEST_BY_FINISHED_OF_P
    + """ l
 where l.status = 'succeeded' and l.has_identity
"""
)


def runbook_blocked(conn: psycopg.Connection) -> set[uuid.UUID]:
    """The datasets step 2b of the Fase 4 runbook classifies BLOCKED (pipeline input): identity-ready (latest sync
    succeeded with identity columns) and read by a pipeline as input (flags/candidates.py runs the query verbatim)."""
    return {r[0] for r in conn.execute(_BLOCKED).fetchall()}


def flag_stage_names(flag) -> tuple[str, ...]:
    """The stages a flag can take: a reader whose ceiling is ``iceberg`` never reaches ``iceberg_only`` (the glance
    shows "·" there, and no series is plotted for it)."""
    if flag.kind == READ and flag.ceiling != ICEBERG_ONLY:
        return tuple(s for s in STAGES[READ] if s != ICEBERG_ONLY)
    return STAGES[flag.kind]


def stage_counts(
    conn: psycopg.Connection, blocked: set[uuid.UUID]
) -> tuple[dict[str, int], dict[tuple[str, str], dict[str, int]]]:
    """(dataset stage → count, (kind, flag) → stage → count), every stage present (zeros included): one query."""
    datasets = dict.fromkeys(DATASET_STAGES, 0)
    flags = {(f.kind, f.name): dict.fromkeys(flag_stage_names(f), 0) for f in FLAGS}
    for kind, name, stage, n in conn.execute(_STAGES, {"blocked": list(blocked)}).fetchall():
        if kind is None:
            datasets[stage] = n
        elif stage in flags[(kind, name)]:  # a stage above the flag's ceiling cannot be counted (clamped)
            flags[(kind, name)][stage] = n
    return datasets, flags


def compute_overview(conn: psycopg.Connection, settings: Settings) -> Overview:
    """The overview now. ``settings``: wedged_after_seconds, lagging_after_seconds and the mirror stream's.
    Long on purpose: each source (stages, verdicts, wedged, behind, native-unsafe, blocked) is read once and folded
    into the counts and the attention list beside it, so what makes a dataset need attention reads top to bottom."""
    started = time.perf_counter()
    computed_at = fetch_value(conn.execute("select now()"), "the database clock (select now())")
    tabular = scopes.tabular_names(conn)
    runbook = runbook_blocked(conn)
    # blocked now: the reverse mirror keeps a pipeline input's dataset_rows while it is on (and can run)
    piped = reverse_settings(conn, runbook)
    cannot_run = capture.reverse_blocked(conn) if runbook else None
    blocked_all = {d for d in runbook if cannot_run or not (d in piped and piped[d].enabled)}
    dataset_stages, flag_stages = stage_counts(conn, blocked_all)
    found: dict[uuid.UUID, dict[str, str]] = {}  # dataset → problem → reason

    def note(ds_id: uuid.UUID, problem: str, reason: str) -> None:
        if ds_id in tabular:
            found.setdefault(ds_id, {})[problem] = reason

    verdicts = dict.fromkeys(VERDICTS, 0)
    latest = parity_verdicts.latest_verdict_reasons(conn)
    for ds_id, (verdict, checked_at, source, reason) in latest.items():
        verdicts[verdict] += 1
        when = f"{checked_at:%Y-%m-%d %H:%M:%S} UTC"
        if verdict == parity_verdicts.MISMATCH:
            note(
                ds_id, MISMATCH, f"parity MISMATCH at {when} ({source}): {reason or ''}; STOP: do not flip, investigate"
            )
        elif verdict == parity_verdicts.ERROR:
            note(ds_id, CHECK_ERROR, f"the parity check could not see the data at {when}: {reason or ''}")
    verdicts[UNCHECKED] = max(0, len(tabular) - len(latest))

    wedged = [
        w
        for w in parity_verdicts.wedged_syncs(conn, settings.mirror.wedged_after_seconds)
        if w["dataset_id"] in tabular
    ]
    for w in wedged:
        error = f": {w['error']}" if w["error"] else ""
        note(
            w["dataset_id"],
            WEDGED,
            f"its latest sync is {w['status']} since {w['started_at']:%Y-%m-%d %H:%M:%S} UTC "
            f"({w['stuck_seconds']} s){error}",
        )

    behind = behind_datasets(conn)
    lagging = lagging_past(behind, settings.mirror.lagging_after_seconds)
    for b in lagging:
        note(
            b.dataset_id,
            LAGGING,
            f"behind Postgres (Iceberg covers version {b.mirrored_version}, Postgres is at {b.rows_version}); "
            f"its latest succeeded sync finished {b.lag_seconds:.0f} s ago, past {settings.mirror.lagging_after_seconds} s",
        )
    lags = [b.lag_seconds for b in behind if b.lag_seconds is not None]

    fallbacks: dict[str, int] = {}
    for ds_id, reader, n, at, error in fallbacks_in_window(conn, FALLBACK_WINDOW_SECONDS):
        fallbacks[reader] = fallbacks.get(reader, 0) + n
        note(
            ds_id,
            FALLBACK,
            f"{reader} fell back to Postgres {n} time(s) in the last {FALLBACK_WINDOW_SECONDS // 3600} h, latest at "
            f"{at:%Y-%m-%d %H:%M:%S} UTC: {(error or '')[:160]} (a soak of {reader} restarts on each)",
        )

    native = native_dataset_ids(conn) & tabular.keys()  # as routing.native_guard.unsafe_native_datasets does
    unsafe = native_blockers(conn, native) if native else []
    for u in unsafe:
        note(
            u.dataset_id,
            NATIVE_UNSAFE,
            "written iceberg-native but fails the write-flip gates: " + "; ".join(u.reasons),
        )

    blocked = {d for d in blocked_all if d in tabular and d not in native}
    pipelines = pipelines_reading(conn, blocked)
    for ds_id in blocked:
        names = ", ".join(pipelines.get(ds_id, [])) or "a pipeline"
        why = (
            f"{piped[ds_id].describe()}: turn it on with `{REVERSE_ON.format(id=ds_id)}`"
            if ds_id in piped and not piped[ds_id].enabled
            else f"the reverse mirror cannot run: {cannot_run}"
        )
        note(
            ds_id,
            BLOCKED,
            f"BLOCKED (pipeline input; reverse mirror off): {names} reads it from {ROWS_TABLE} (F3), which stays "
            f"fresh for a native dataset only through the reverse mirror; {why}",
        )
    rlags, reverse_off = reverse_lags(conn, native)
    behind_reverse = sorted(
        (dataclasses.replace(r, name=tabular[r.dataset_id][0]) for r in rlags.values() if not r.caught_up),
        key=lambda r: (-(r.lag_seconds or 0), r.name, str(r.dataset_id)),
    )

    states = {d: f.state for d, f in lifecycle_of(conn, list(tabular)).items()}
    all_proofs = proofs(conn, [r.name for r in PROVEN_READERS], None)
    needs = threshold(conn, settings)  # what a flip's gate applies (stored for every process, else this one's)
    needed = needs.reads
    held = held_on_postgres(conn, tabular, states, all_proofs, needed)

    problems = {p: sum(1 for f in found.values() if p in f) for p in PROBLEMS}
    ranked = sorted(found.items(), key=lambda kv: (min(PROBLEMS.index(p) for p in kv[1]), tabular[kv[0]][0], kv[0]))
    shown = ranked[:ATTENTION_SHOWN]
    workspaces = _workspace_names(conn, {tabular[d][1] for d, _ in shown} - {None})
    attention = []
    for ds_id, reasons in shown:
        order = sorted(reasons, key=PROBLEMS.index)
        name, ws_id = tabular[ds_id]
        attention.append(
            Attention(
                ds_id,
                name,
                ws_id,
                workspaces.get(ws_id),
                order[0],
                tuple(order),
                " · ".join(f"{p}: {reasons[p]}" if p != order[0] else reasons[p] for p in order),
            )
        )
    return Overview(
        computed_at=computed_at,
        seconds=round(time.perf_counter() - started, 3),
        datasets=len(tabular),
        dataset_stages=dataset_stages,
        blocked=len(blocked),
        blocked_names=sorted(tabular[d][0] for d in blocked)[:ATTENTION_SHOWN],
        flag_stages=flag_stages,
        verdicts=verdicts,
        wedged=len(wedged),
        behind=len(behind),
        never_synced=sum(1 for b in behind if b.never_synced),
        lagging=len(lagging),
        max_lag_seconds=round(max(lags), 1) if lags else None,
        lag_threshold_seconds=settings.mirror.lagging_after_seconds,
        native=len(native),
        native_unsafe=len(unsafe),
        problems=problems,
        attention=attention,
        attention_total=len(found),
        fallbacks=dict(sorted(fallbacks.items())),
        stream=shard_status(conn, settings.stream),
        piped_reverse_on=sum(1 for d in runbook - blocked_all if d in tabular and d not in native),
        reverse_on=len(rlags),
        reverse_off=reverse_off,
        reverse_behind=len(behind_reverse),
        reverse_max_lag_seconds=max((r.lag_seconds or 0.0 for r in behind_reverse), default=None),
        reverse_lags=behind_reverse[:ATTENTION_SHOWN],
        lifecycle=_lifecycle_counts(states),
        held=held[:ATTENTION_SHOWN],
        held_total=len(held),
        held_by={h: sum(1 for x in held if h in x.holders) for h in HOLDERS},
        shadow=shadow_summaries(all_proofs, needed),
        threshold=needs,
    )


def _lifecycle_counts(states: dict[uuid.UUID, str]) -> dict[str, int]:
    """Tabular datasets per lifecycle state (lifecycle/), every state present: the stored states, read, not derived."""
    counts = dict.fromkeys(lifecycle.STATES, 0)
    for state in states.values():
        counts[state] += 1
    return counts


def _workspace_names(conn: psycopg.Connection, ids: set) -> dict:
    if not ids:
        return {}
    return app_tables.workspace_names(conn, list(ids))
