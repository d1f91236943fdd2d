"""Flags in the Dagster UI: `flag_state` shows the effective modes; `set_flag` / `clear_flag` change them
(behind the flip gates); `write_flip_candidates` is the writer runbook's step 2b.

The launchpad config is typed; its values go through the same core functions as
`lakehouse flags|write-flags set|clear`, so a refusal reads the same and writes nothing.
(No ``from __future__ import annotations`` here: Dagster reads the Config annotations at runtime.)
"""

import dataclasses
from enum import Enum
from typing import Optional

import dagster as dg
from pydantic import Field

from lakehouse_dagster.api.datasets import get_dataset
from lakehouse_dagster.api.flags import (
    FLIPPABLE_WRITERS,
    MODES,
    READ,
    READERS,
    WRITE,
    WRITERS,
    FlagResolver,
    clear_flag,
    list_overrides,
    narrower_overrides,
    remaining_lines,
    set_flag,
    write_flip_candidates,
)
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.refusals import refuse
from lakehouse_dagster.dagster.defs.shared.tables import logged_table, table
from lakehouse_dagster.dagster.defs.shared.tags import WRITER, dataset_tags, flag_tags, tag_run, text


class FlagKind(Enum):
    read = "read"
    write = "write"


_NAMES_HELP = f"readers: {', '.join(READERS)}; writers: {', '.join(WRITERS)}"
_MODES_HELP = f"read: {' < '.join(MODES[READ])}; write: {' < '.join(MODES[WRITE])}"


class FlagStateConfig(dg.Config):
    dataset_id: Optional[str] = Field(
        default=None, description="dataset uuid; empty = the global view (global overrides and defaults)"
    )


_KIND = Field(default=FlagKind.read, description="read (lakehouse flags) or write (lakehouse write-flags)")
_DATASET = Field(default=None, description="dataset uuid (most specific scope); leave both scopes empty for global")
_WORKSPACE = Field(default=None, description="workspace uuid; not together with dataset_id")
_NOTE = Field(default=None, description="why (kept with the override and in the audit)")


class SetFlagConfig(dg.Config):
    kind: FlagKind = _KIND
    name: str = Field(description=_NAMES_HELP)
    mode: str = Field(description=_MODES_HELP)
    dataset_id: Optional[str] = _DATASET
    workspace_id: Optional[str] = _WORKSPACE
    note: Optional[str] = _NOTE


class ClearFlagConfig(dg.Config):
    kind: FlagKind = _KIND
    name: str = Field(description=_NAMES_HELP)
    dataset_id: Optional[str] = _DATASET
    workspace_id: Optional[str] = _WORKSPACE
    note: Optional[str] = _NOTE


def _actor(context: dg.OpExecutionContext, lakehouse: LakehouseResource) -> str:
    return f"{lakehouse.settings().project.actor} (dagster run {context.run_id[:8]})"


@dg.op(description="The effective mode of every reader and writer for a dataset, and every runtime override.")
def flag_state_op(context: dg.OpExecutionContext, config: FlagStateConfig, lakehouse: LakehouseResource) -> list[dict]:
    settings = lakehouse.settings()
    with lakehouse.connect() as conn:
        tag_run(context, dataset_tags(conn, config.dataset_id))
        try:
            ds = get_dataset(conn, config.dataset_id) if config.dataset_id else None
        except LakehouseError as exc:
            raise refuse(exc) from None
        resolver = FlagResolver(conn, settings.flags.ttl_seconds)
        state = [
            {
                "kind": r.kind,
                "name": r.name,
                "mode": r.mode,
                "reason": r.reason,
                "ceiling": r.ceiling,
                "class": r.consistency or "",
            }
            for r in resolver.resolve_all(ds.id if ds else None)
        ]
        overrides = list_overrides(conn)
    where = f"dataset {ds.id} ({ds.name})" if ds else "global view"
    for s in state:
        context.log.info(f"{s['kind']} {s['name']}: {s['mode']} ({s['reason']}) [{where}]")
    over = [
        {**dataclasses.asdict(o), "scope_id": str(o.scope_id or ""), "note": o.note or "", "set_at": str(o.set_at)}
        for o in overrides
    ]
    context.add_output_metadata(
        {
            "scope": where,
            "effective_modes": table(
                state,
                [
                    ("kind", "string"),
                    ("name", "string"),
                    ("class", "string"),
                    ("mode", "string"),
                    ("reason", "string"),
                    ("ceiling", "string"),
                ],
            ),
            "overrides": logged_table(
                context,
                "override",
                over,
                [
                    ("kind", "string"),
                    ("name", "string"),
                    ("scope", "string"),
                    ("scope_id", "string"),
                    ("mode", "string"),
                    ("set_by", "string"),
                    ("set_at", "string"),
                    ("note", "string"),
                ],
            ),
            "native_writers": [s["name"] for s in state if s["mode"] == "iceberg_native"],
            "iceberg_readers": [s["name"] for s in state if s["mode"] in ("iceberg", "iceberg_only")],
        }
    )
    return state


@dg.op(description="Set a read/write flag override, validated exactly like `lakehouse flags|write-flags set`.")
def set_flag_op(context: dg.OpExecutionContext, config: SetFlagConfig, lakehouse: LakehouseResource) -> dict:
    with lakehouse.connect() as conn:
        tag_run(context, flag_tags(conn, config.kind.value, config.name, config.dataset_id, config.workspace_id))
        try:
            change = set_flag(
                conn,
                config.kind.value,
                config.name,
                config.mode,
                dataset=config.dataset_id,
                workspace=config.workspace_id,
                note=config.note,
                actor=_actor(context, lakehouse),
            )
        except LakehouseError as exc:
            raise refuse(exc) from None
    context.log.info(f"{change.flag.name}: {change.before or '(no override)'} → {change.after} ({change.scope})")
    context.add_output_metadata(
        {
            "flag": change.flag.name,
            "scope": str(change.scope),
            "before": change.before or "(no override)",
            "after": change.after,
            "audit_id": text(change.audit.id if change.audit else None),  # (a set always writes one)
        }
    )
    return {"name": change.flag.name, "scope": str(change.scope), "before": change.before, "after": change.after}


@dg.op(description="Drop a flag override (back to the next scope or the default), like `... clear`.")
def clear_flag_op(context: dg.OpExecutionContext, config: ClearFlagConfig, lakehouse: LakehouseResource) -> dict:
    with lakehouse.connect() as conn:
        tag_run(context, flag_tags(conn, config.kind.value, config.name, config.dataset_id, config.workspace_id))
        try:
            change = clear_flag(
                conn,
                config.kind.value,
                config.name,
                dataset=config.dataset_id,
                workspace=config.workspace_id,
                note=config.note,
                actor=_actor(context, lakehouse),
            )
        except LakehouseError as exc:
            raise refuse(exc) from None
        remaining = remaining_lines(
            conn, change.flag, narrower_overrides(conn, config.kind.value, change.flag.name, change.scope)
        )
    msg = f"cleared {change.before}" if change.changed else "no override to clear; nothing changed"
    context.log.info(f"{change.flag.name} ({change.scope}): {msg}")
    for line in remaining:
        context.log.warning(line.strip())
    context.add_output_metadata(
        {
            "flag": change.flag.name,
            "scope": str(change.scope),
            "result": msg,
            "narrower_remaining": "\n".join(remaining) or "none",
        }
    )
    return {"name": change.flag.name, "scope": str(change.scope), "before": change.before, "changed": change.changed}


FlippableWriter = Enum("FlippableWriter", {w.name: w.name for w in FLIPPABLE_WRITERS})  # type: ignore[misc]  # built from the registry


class CandidatesConfig(dg.Config):
    writer: FlippableWriter = Field(default=FlippableWriter("sync.full"), description="the writer to flip")


@dg.op(description="The writer runbook's step 2b (SAFE / BLOCKED) and what each dataset still lacks for a flip.")
def write_flip_candidates_op(
    context: dg.OpExecutionContext, config: CandidatesConfig, lakehouse: LakehouseResource
) -> list[dict]:
    tag_run(context, {WRITER: config.writer.value})
    with lakehouse.connect() as conn:
        try:
            found = write_flip_candidates(conn, config.writer.value)
        except LakehouseError as exc:
            raise refuse(exc) from None
    rows = [{**c.as_dict(), "still_needs": "; ".join(c.reasons)} for c in found]
    context.add_output_metadata(
        {
            "writer": config.writer.value,
            "identity_ready": len(found),
            "ready_to_flip": sum(c.ready for c in found),
            "blocked_pipeline_input": sum(not c.safe for c in found),  # pipeline inputs whose reverse mirror is off
            "candidates": logged_table(
                context,
                "candidate",
                rows,
                [
                    ("verdict", "string"),
                    ("ready", "bool"),
                    ("name", "string"),
                    ("row_count", "int"),
                    ("dataset_id", "string"),
                    ("writer_mode", "string"),
                    ("still_needs", "string"),
                ],
            ),
        }
    )
    return [c.as_dict() for c in found]


@dg.job(
    name="write_flip_candidates",
    description="Fase 4 step 2b: identity-ready datasets as SAFE / BLOCKED (pipeline input), and which are ready "
    "to flip now (readers on Iceberg, caught up, parity ok).",
    tags={"lakehouse/area": "flags"},
)
def write_flip_candidates_job():
    write_flip_candidates_op()


@dg.job(
    name="flag_state",
    description=f"List the effective read/write modes (and why) for a dataset. {_NAMES_HELP}",
    tags={"lakehouse/area": "flags"},
)
def flag_state_job():
    flag_state_op()


@dg.job(
    name="set_flag",
    description=f"Set a flag override (runbook step: flip / widen / rollback). {_NAMES_HELP}. Modes — {_MODES_HELP}.",
    tags={"lakehouse/area": "flags"},
)
def set_flag_job():
    set_flag_op()


@dg.job(
    name="clear_flag",
    description="Drop a flag override (rollback to the next scope or the registry default).",
    tags={"lakehouse/area": "flags"},
)
def clear_flag_job():
    clear_flag_op()
