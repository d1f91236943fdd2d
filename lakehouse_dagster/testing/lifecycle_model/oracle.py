"""The model's oracle: what the facts are, in plain Python, and the runbooks' rules for moving between states
written out again on their own (not the project's precedence code)."""

from __future__ import annotations

import dataclasses
from typing import Any

from lakehouse_dagster.flags.registry import SERVABLE_READERS
from lakehouse_dagster.lifecycle import COMPLETE_VERB
from lakehouse_dagster.lifecycle import states as S

SCHEMA = [{"name": "a", "type": "int64"}]
WRITERS = ("sync.full", "sync.append")
READER = "export.stream"
READERS = tuple(r.name for r in SERVABLE_READERS)  # any of them on Iceberg makes a mirrored dataset read-flipped


@dataclasses.dataclass
class Oracle:
    """What the facts are, in plain Python (not the project's precedence code), and where the rows must be."""

    ws_of: dict  # dataset → workspace
    overrides: dict = dataclasses.field(default_factory=dict)  # (kind, name, scope, id) → mode
    reverse: dict = dataclasses.field(default_factory=dict)  # (scope, id) → bool
    marks: dict = dataclasses.field(default_factory=dict)  # dataset → in_progress | complete | restoring | restored
    mirrored: set = dataclasses.field(default_factory=set)
    pg_rows: dict = dataclasses.field(default_factory=dict)  # dataset → rows dataset_rows must hold
    iceberg_only: dict = dataclasses.field(default_factory=dict)  # dataset → rows complete retired from Postgres

    def _pick(self, table: dict, key_of, d):
        for scope, sid in (("dataset", d), ("workspace", self.ws_of[d]), ("global", None)):
            if key_of(scope, sid) in table:
                return table[key_of(scope, sid)]
        return None

    def mode(self, kind: str, name: str, d) -> str:
        found = self._pick(self.overrides, lambda s, i: (kind, name, s, i), d)
        return found or ("pg" if kind == "write" else "off")

    def state(self, d) -> S.Facts:
        natives = tuple(sorted(w for w in WRITERS if self.mode("write", w, d) == "iceberg_native"))
        mark = self.marks.get(d)
        name = {"in_progress": S.COMPLETING, "complete": S.COMPLETE, "restoring": S.RESTORING}.get(mark or "")
        if name is None:
            if natives:
                name = S.NATIVE
            elif d in self.mirrored:
                reading = any(self.mode("read", r, d) in ("iceberg", "iceberg_only") for r in READERS)
                name = S.READ_FLIPPED if reading else S.MIRRORED
            else:
                name = S.PG
        rev = self._pick(self.reverse, lambda s, i: (s, i), d)
        on = True if rev is None else rev
        return S.Facts(name, on if S.AUTHORITY[name] == S.ICEBERG else None, natives)

    def may_move(self, before: S.Facts, after: S.Facts, verb: str) -> bool:
        """The runbooks' rules, written out again on their own: where Iceberg alone holds rows nothing but a
        restore moves the dataset; complete only from native; the reverse stays off while Postgres lacks rows."""
        if before.same_place(after):
            return not (after.state != S.NATIVE and S.AUTHORITY[after.state] == S.ICEBERG and not after.native_writers)
        if before.state in (S.COMPLETING, S.COMPLETE, S.RESTORING):
            return verb in (COMPLETE_VERB, S.RESTORE) and after.state in (S.COMPLETE, S.RESTORING, S.NATIVE)
        if after.state in (S.COMPLETING, S.COMPLETE):
            return verb == COMPLETE_VERB and not after.reverse
        if verb == S.REVERSE:
            return before.state == after.state == S.NATIVE
        if verb == S.READER_FLAG:
            return {before.state, after.state} <= {S.MIRRORED, S.READ_FLIPPED}
        if verb == S.WRITER_FLAG:
            return S.NATIVE in (before.state, after.state) and S.AUTHORITY[before.state] != S.AUTHORITY[after.state]
        return False


class ModelParts:
    """What the moves' mixins (plans.py, crashes.py, ingest.py) use of the machine that base.py and iceberg.py
    define: declared here for the type checker only."""

    conn: Any
    dsn: str
    ids: list
    ws: list
    o: Oracle
    next_index: dict
    settings: Any
    catalog: Any
    lake_settings: Any
    tables: set
    audit_seen: int
    reverse_seen: int
    plan_evidence: set
    _saw: Any
    _audit_max: Any
    _audit_mark: Any
    _follow_audit: Any
    _live: Any
    _iceberg_count: Any
    _native_one: Any
    native_write: Any
    first_snapshot: Any
    iceberg_rows: dict
    files: dict
    read: dict
    _drop_file: Any
    _reverse_check: Any
    _ingest: Any
    readied: set
    every_reader_flag: Any
