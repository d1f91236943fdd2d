"""What a flip over a scope does to each dataset in it, counted and named: what it moves, what a narrower override
pins below the new mode, what already resolves to it, and what the flag does not apply to.

"Most-specific scope wins (dataset > workspace > global)": a workspace or global flip moves only the datasets no
narrower override decides. Pinning the datasets that are not ready (``write-flags set <writer> pg --dataset <id>``)
and widening moves the others: the supported way to widen around unready datasets, and the report names both.
Manifest datasets (file-backed) are outside a write flip (their writer, dataset.manifest, is locked to pg): listed
as not applicable, never judged by the gates. A scope flip that moves no existing dataset still raises the scope's
own mode (what datasets created there later get): the runbooks' global step after every workspace is flipped.
"""

from __future__ import annotations

import dataclasses
import uuid

import psycopg

from lakehouse_dagster.flags.overrides import DATASET, GLOBAL, WORKSPACE, Scope
from lakehouse_dagster.flags.registry import WRITE, Flag, rank
from lakehouse_dagster.flags.stored import resolve_for, stored_overrides
from lakehouse_dagster.flags.widen import place, scope_mode
from lakehouse_dagster.tracking import datasets as app_tables
from lakehouse_dagster.tracking.datasets import scopes

_SHOWN = 20


@dataclasses.dataclass(frozen=True)
class InScope:
    dataset_id: uuid.UUID
    name: str
    before: str
    after: str
    decided_by: str  # dataset | workspace | global | default: the override that decides its mode after the flip
    kind: str  # tabular | manifest

    def label(self) -> str:
        return f"{self.name} ({self.dataset_id})"


@dataclasses.dataclass
class ScopeReport:
    flag: Flag
    mode: str
    scope: Scope
    moved: list[InScope]  # tabular datasets whose effective mode goes to ``mode``
    pinned: list[InScope]  # kept below ``mode`` by a narrower override
    already: list[InScope]  # resolve to ``mode`` or above already
    not_applicable: list[InScope]  # file-backed (manifest) datasets: outside a write flip; a read flip moves them inert
    scope_before: str  # the scope's own mode before the flip
    names: dict  # dataset and workspace names by id

    @property
    def total(self) -> int:
        return len(self.moved) + len(self.pinned) + len(self.already) + len(self.not_applicable)

    @property
    def raises_scope(self) -> bool:
        """The scope's own mode rises (workspace / global only): datasets created there later get ``mode``."""
        return self.scope.scope != DATASET and rank(self.flag.kind, self.scope_before) < rank(self.flag.kind, self.mode)

    @property
    def where(self) -> str:
        return place(self.scope.scope, self.scope.scope_id, self.names)

    def counts_line(self) -> str:
        """One line: how many datasets it moves, pins, finds already there, and leaves out."""
        parts = [f"moves {len(self.moved)} of {self.total} dataset(s) in {self.where} to {self.mode}"]
        if self.pinned:
            parts.append(f"{len(self.pinned)} pinned below it by a narrower override")
        if self.already:
            parts.append(f"{len(self.already)} already at {self.mode} or above")
        if self.not_applicable:
            what = "outside a write flip" if self.flag.kind == WRITE else "not Iceberg-tabular"
            parts.append(f"{len(self.not_applicable)} manifest dataset(s) {what}")
        line = "; ".join(parts)
        if self.raises_scope:
            line += f"; the {self.scope.scope} override decides for datasets created " + (
                "later" if self.scope.scope == GLOBAL else "in it later"
            )
        return line

    def lines(self) -> list[str]:
        """The counts line, then the datasets of each group by name and id (20 per group at most)."""
        out = [self.counts_line()]
        for title, group, why in (
            ("moves", self.moved, lambda d: f"{d.before} → {d.after}"),
            ("pinned", self.pinned, lambda d: f"{d.after}, by its {self._by(d)}"),
            ("already", self.already, lambda d: f"{d.after}, by {self._by_already(d)}"),
            ("not applicable", self.not_applicable, lambda d: self._not_applicable(d)),
        ):
            for d in group[:_SHOWN]:
                out.append(f"  {title}: {d.label()}: {why(d)}")
            if len(group) > _SHOWN:
                out.append(f"  {title}: ... and {len(group) - _SHOWN} more")
        return out

    def _by(self, d: InScope) -> str:
        return "dataset override" if d.decided_by == DATASET else "workspace override"

    def _by_already(self, d: InScope) -> str:
        if d.decided_by in (DATASET, WORKSPACE):
            return f"its {d.decided_by} override"
        return "the global override" if d.decided_by == GLOBAL else "the registry default"

    def _not_applicable(self, d: InScope) -> str:
        if self.flag.kind == WRITE:
            return (
                f"a {d.kind} dataset (file-backed, written by dataset.manifest, locked to pg): write flips do not apply"
            )
        return f"a {d.kind} dataset, not Iceberg-tabular: the read router keeps serving it from Postgres"

    def nothing_to_flip(self, verb: str) -> str:
        """Why this flip would write nothing useful, in one line (a flip that moves no dataset and leaves the scope's own
        mode where it is)."""
        if not self.total:
            why = "no dataset exists" if self.scope.scope == GLOBAL else f"{self.where} holds no dataset"
        else:
            bits = []
            if self.already:
                bits.append(f"{len(self.already)} already resolve {self.flag.name} to {self.mode} or above")
            if self.pinned:
                shown = ", ".join(f"{d.label()} ({d.after}, {self._by(d)})" for d in self.pinned[:5])
                more = f" and {len(self.pinned) - 5} more" if len(self.pinned) > 5 else ""
                bits.append(f"{len(self.pinned)} are pinned below it by a narrower override: {shown}{more}")
            if self.not_applicable:
                bits.append(
                    f"{len(self.not_applicable)} are manifest datasets ({self._not_applicable(self.not_applicable[0])})"
                )
            why = f"of the {self.total} dataset(s) in {self.where}, " + "; ".join(bits)
            if self.scope.scope != DATASET:
                why += f", and {self.where} itself already resolves it to {self.scope_before}"
        return (
            f"nothing to flip: {why}; nothing written (see `lakehouse datasets` and "
            f"`lakehouse {verb} list --dataset <id>`)"
        )

    def as_dict(self) -> dict:
        def rows(group: list[InScope]) -> list[dict]:
            return [{**dataclasses.asdict(d), "dataset_id": str(d.dataset_id)} for d in group]

        return {
            "moved": rows(self.moved),
            "pinned": rows(self.pinned),
            "already": rows(self.already),
            "not_applicable": rows(self.not_applicable),
            "scope_before": self.scope_before,
            "raises_scope": self.raises_scope,
        }


def _decided_by(stored: dict, ds_id: uuid.UUID, ws_id: uuid.UUID | None) -> str:
    if (DATASET, ds_id) in stored:
        return DATASET
    if ws_id is not None and (WORKSPACE, ws_id) in stored:
        return WORKSPACE
    return GLOBAL if (GLOBAL, None) in stored else "default"


def scope_report(conn: psycopg.Connection, flag: Flag, scope: Scope, mode: str) -> ScopeReport:
    """What setting ``mode`` at ``scope`` does to every dataset in it (read from the stored overrides now)."""
    stored = stored_overrides(conn, flag.kind, [flag.name])[flag.name]
    after_stored = {**stored, (scope.scope, scope.scope_id): mode}
    rows = scopes.in_scope(conn, scope.scope, scope.scope_id, ordered=True)
    report = ScopeReport(flag, mode, scope, [], [], [], [], scope_mode(conn, flag, scope), _names(conn, rows, scope))
    for ds_id, name, ws_id, kind in rows:
        before, after = resolve_for(flag, stored, ds_id, ws_id), resolve_for(flag, after_stored, ds_id, ws_id)
        d = InScope(ds_id, name, before, after, _decided_by(after_stored, ds_id, ws_id), kind)
        if kind != "tabular" and (flag.kind == WRITE or before != after):
            report.not_applicable.append(d)
        elif before != after:
            report.moved.append(d)
        elif rank(flag.kind, after) >= rank(flag.kind, mode):
            report.already.append(d)
        else:
            report.pinned.append(d)
    return report


def _names(conn: psycopg.Connection, rows: list[tuple], scope: Scope) -> dict:
    names = {r[0]: r[1] for r in rows}
    if scope.scope == WORKSPACE:
        names.update(app_tables.workspace_names(conn, [scope.scope_id]))
    return names
