"""The flag registry: every reader and writer the runbooks name, in one place.

Each entry carries its consistency class (readers), its ceiling (maxMode: the highest mode it may
ever resolve to) and its registry default. Runtime overrides (overrides.py) move a flag between
modes; nothing — not even a row written by hand — lifts it above its ceiling.

The compute readers (``proof``: objects.sync, dashboards.aggregate, pipeline.expectations) ask structured reads —
row ids, keyset pages, filters, aggregates (routing/request.py, issue 43) — that two executors answer. Their ceilings
let them read Iceberg, but a flip of one for a dataset is gated on proof (flags/proof.py): its shadow reads of that
dataset compared equal, enough times in a row, since the dataset's last change of schema. Until then they read
``dataset_rows`` and count as Postgres consumers (the reverse mirror keeps them; ``complete`` waits for their flip).
"""

from __future__ import annotations

import dataclasses

from lakehouse_dagster.core.errors import BadInput

READ = "read"
WRITE = "write"
KINDS = (READ, WRITE)

# Ordered: a mode's position is its rank, so "above the ceiling" is a comparison.
READ_MODES = ("off", "shadow", "iceberg", "iceberg_only")
WRITE_MODES = ("pg", "iceberg_native")
MODES = {READ: READ_MODES, WRITE: WRITE_MODES}
_RANK = {kind: {m: i for i, m in enumerate(modes)} for kind, modes in MODES.items()}

EVENTUAL = "EVENTUAL"  # lag-tolerant: Iceberg once any succeeded snapshot exists
STRICT = "STRICT"  # must see the latest write: Iceberg only when the snapshot covers the current PG version

# What the CLI calls each kind (the runbooks' two commands).
COMMAND = {READ: "lakehouse flags", WRITE: "lakehouse write-flags"}


@dataclasses.dataclass(frozen=True)
class Flag:
    kind: str  # "read" | "write"
    name: str
    ceiling: str  # maxMode
    default: str
    description: str
    consistency: str | None = None  # readers only
    ceiling_reason: str | None = None  # why the ceiling is where it is (required when it blocks a flip)
    iceberg_mode: str | None = None  # writers only: "append" | "replace" on the native path
    proof: bool = False  # readers only: a flip to iceberg needs proven shadow consistency (flags/proof.py)

    @property
    def modes(self) -> tuple[str, ...]:
        return MODES[self.kind]

    @property
    def what(self) -> str:
        return "reader" if self.kind == READ else "writer"

    @property
    def allowed_modes(self) -> tuple[str, ...]:
        return self.modes[: _RANK[self.kind][self.ceiling] + 1]


def _reader(name, consistency, ceiling, description, ceiling_reason=None, proof=False) -> Flag:
    return Flag(READ, name, ceiling, "off", description, consistency, ceiling_reason, proof=proof)


def _writer(name, ceiling, iceberg_mode, description, ceiling_reason=None) -> Flag:
    return Flag(WRITE, name, ceiling, "pg", description, None, ceiling_reason, iceberg_mode)


_PROVEN = "structured reads (docs/reads.md) on both executors; a flip needs proven shadow consistency"

READERS: dict[str, Flag] = {
    f.name: f
    for f in (
        # Fase 1: EVENTUAL readers with a complete Iceberg executor.
        _reader(
            "export.stream",
            EVENTUAL,
            "iceberg_only",
            "dataset export; Iceberg scan order is unspecified unless ordered by __row_index",
        ),
        _reader("graph.kuzu", EVENTUAL, "iceberg_only", "graph hydration (bulk load, order-independent)"),
        _reader(
            "studio.digest",
            EVENTUAL,
            "iceberg",
            "approximate sampler for dataset profiles",
            "samplers keep the PG fallback: it costs nothing",
        ),
        _reader(
            "studio.training_pairs",
            EVENTUAL,
            "iceberg",
            "approximate sampler for training pairs",
            "samplers keep the PG fallback: it costs nothing",
        ),
        # The compute readers (issue 43: Phase 4 addressing, Stage 1 compute): servable by the Iceberg executor of
        # structured reads, flipped only once shadow reads prove it equal to Postgres for the dataset.
        _reader(
            "objects.sync",
            EVENTUAL,
            "iceberg_only",
            f"object sync by row id and row_index (row_ids, keyset pages): {_PROVEN}",
            proof=True,
        ),
        _reader(
            "dashboards.aggregate",
            EVENTUAL,
            "iceberg",
            f"dashboard aggregates (where, group_by, measures): {_PROVEN}",
            "keeps the PG fallback: a request the Iceberg executor cannot answer exactly (a column not yet in the "
            "snapshot, delete files) is served by Postgres",
            proof=True,
        ),
        _reader(
            "pipeline.expectations",
            STRICT,
            "iceberg",
            f"pipeline expectation checks (where, aggregates; STRICT: Iceberg only when caught up): {_PROVEN}",
            "keeps the PG fallback: STRICT, it reads Postgres whenever the snapshot lags (the caught-up gate)",
            proof=True,
        ),
        _reader(
            "sdk.files.list",
            EVENTUAL,
            "off",
            "SDK file listing",
            "file-backed/manifest datasets are not Iceberg-tabular",
        ),
        _reader(
            "mediaset.item",
            STRICT,
            "off",
            "media set item lookup",
            "file-backed/manifest datasets are not Iceberg-tabular",
        ),
        # STRICT interactive reader of this project: serves Iceberg only when caught up with Postgres.
        _reader(
            "studio.preview",
            STRICT,
            "iceberg",
            "interactive dataset preview (projection + limit); must show the latest write, so it reads "
            "Iceberg only when the snapshot covers the current Postgres version",
            "interactive: keeps the PG fallback",
        ),
    )
}

WRITERS: dict[str, Flag] = {
    f.name: f
    for f in (
        _writer("sync.full", "iceberg_native", "replace", "full source sync (replaces the dataset's rows)"),
        _writer("sync.append", "iceberg_native", "append", "append-only source sync"),
        _writer("sync.incremental", "iceberg_native", "append", "incremental source sync (new rows since the cursor)"),
        _writer("cdc.append", "iceberg_native", "append", "change-data-capture append"),
        _writer(
            "ingest.stream",
            "pg",
            None,
            "streaming ingest",
            "streaming transaction: rows commit statement by statement on dataset_rows",
        ),
        _writer(
            "row.edit",
            "pg",
            None,
            "single-row edits",
            "a point DELETE/UPDATE has no Iceberg primitive; the runbooks leave row edits to Karma, the platform's "
            "compute layer (not part of this project)",
        ),
        _writer("dataset.manifest", "pg", None, "manifest datasets", "file-backed pointers, not Iceberg-tabular"),
        _writer(
            "pipeline.output",
            "pg",
            None,
            "pipeline outputs",
            "written in Postgres by Karma, the platform's compute layer (not part of this project)",
        ),
    )
}

REGISTRY: dict[str, dict[str, Flag]] = {READ: READERS, WRITE: WRITERS}

# Writers whose ceiling allows the native path: the only ones that can make a dataset native.
FLIPPABLE_WRITERS = tuple(w for w in WRITERS.values() if w.ceiling == "iceberg_native")
# Readers Iceberg can serve (ceiling iceberg or above) without proof: the ones prerequisite #1 asks to read-flip first.
SERVABLE_READERS = tuple(r for r in READERS.values() if r.ceiling in ("iceberg", "iceberg_only") and not r.proof)
# The compute readers: servable, flipped per dataset once proven (flags/proof.py); on Postgres until then.
PROVEN_READERS = tuple(r for r in READERS.values() if r.proof)


def rank(kind: str, mode: str) -> int:
    return _RANK[kind][mode]


def reads_postgres(mode: str) -> bool:
    """Does a reader in this effective mode (clamped: never above its ceiling) read ``dataset_rows``? What the gates,
    ``complete`` and the router's reverse copy count as a Postgres consumer: a reader below iceberg."""
    return rank(READ, mode) < rank(READ, "iceberg")


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise BadInput(f"unknown flag kind {kind!r}; use 'read' (lakehouse flags) or 'write' (lakehouse write-flags)")
    return kind


def get_flag(kind: str, name: str) -> Flag:
    """The registry entry, or a refusal that lists the known names (and points at the other command)."""
    check_kind(kind)
    flag = REGISTRY[kind].get(name)
    if flag is not None:
        return flag
    what = "reader" if kind == READ else "writer"
    other = WRITE if kind == READ else READ
    hint = (
        f" ({name} is a {'writer' if kind == READ else 'reader'}: use {COMMAND[other]})"
        if name in REGISTRY[other]
        else ""
    )
    raise BadInput(f"unknown {what} {name!r}{hint}; known {what}s: {', '.join(REGISTRY[kind])}")


def check_mode(flag: Flag, mode: str) -> str:
    """Refuse an unknown mode or one above the flag's ceiling, saying what is allowed and why."""
    if mode not in flag.modes:
        raise BadInput(
            f"unknown mode {mode!r} for {flag.what} {flag.name}; {flag.what} modes are {' < '.join(flag.modes)}"
        )
    if rank(flag.kind, mode) > rank(flag.kind, flag.ceiling):
        why = f" ({flag.ceiling_reason})" if flag.ceiling_reason else ""
        raise BadInput(
            f"mode {mode!r} is above the ceiling of {flag.name} (maxMode={flag.ceiling}){why}; "
            f"allowed: {', '.join(flag.allowed_modes)}"
        )
    return mode


def clamp(flag: Flag, mode: str) -> tuple[str, bool]:
    """(mode, clamped): a stored mode above the ceiling resolves to the ceiling."""
    if rank(flag.kind, mode) > rank(flag.kind, flag.ceiling):
        return flag.ceiling, True
    return mode, False


def _check_registry() -> None:
    for kind, flags in REGISTRY.items():
        for f in flags.values():
            assert f.kind == kind and f.ceiling in MODES[kind] and f.default in MODES[kind], f
            assert rank(kind, f.default) <= rank(kind, f.ceiling), f
            assert f.ceiling == MODES[kind][-1] or f.ceiling_reason, f"{f.name}: a ceiling below max needs a reason"
            assert (f.consistency in (EVENTUAL, STRICT)) == (kind == READ), f
            assert not f.proof or rank(kind, f.ceiling) >= rank(kind, "iceberg"), f"{f.name}: proof of what?"
    assert not set(READERS) & set(WRITERS), "a name must be a reader or a writer, not both"


_check_registry()
