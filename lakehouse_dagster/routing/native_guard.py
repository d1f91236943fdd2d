"""Gates that hold after the flip: a dataset written iceberg-native must keep passing the write-flip gates.

The flip gates (flags/gates.py) judge datasets once, when an operator's change moves them. A dataset can
become covered by a native writer later with nobody judging it: created in (or moved to) a workspace whose
writer is native, a pipeline that starts reading it as input, a reader lowered by hand
(``overrides.set_override`` is ungated). The write router asks ``native_blockers`` before every native write
and refuses (``refuse_unsafe_native_write``); the ``native_safety`` sensor lists every such dataset
(``unsafe_native_datasets``).

The reasons are the gates' own (``gates.write_flip_blockers``, one definition); this module only chooses
which of them apply to a dataset, by what Postgres still is for it:

* **already native** — its latest succeeded sync was written natively: Iceberg is the truth and Postgres
  is frozen by design, so the reasons about the moment of the flip (``gates.AtFlip``: mirrored, caught up,
  parity ok at the current Postgres version) are false by construction — a ``row.edit`` or a schema change
  moves the Postgres version of a native dataset and means nothing — and are dropped. The others
  (file-backed, readers on Postgres, a pipeline input or a declared Postgres-locked reader with the reverse
  mirror off, and whatever the gates add) hold for as long as the dataset is native.
* **new and empty** — no rows in ``dataset_rows`` and never mirrored (a dataset created after its workspace
  was flipped): there is nothing in Postgres to lose or to compare, so the at-flip reasons are dropped too.
  It is written natively when nothing reads it from Postgres: not a pipeline input, and its Iceberg-servable
  readers on iceberg — what an operator who read-flipped then write-flipped the workspace expects of a dataset
  created there afterwards. A reader still at ``off`` refuses it: read-flip first, as for any dataset.
* **otherwise** — its Postgres rows are the truth (never written natively, or its latest content came from
  the mirror, e.g. after a rollback): this write IS its flip, so every reason applies.

Cost: one query classifies the datasets, then the gates' few set-based queries (for any number of datasets).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Iterable

import psycopg

from lakehouse_dagster.core.errors import FlipRefused
from lakehouse_dagster.flags.gates import NATIVE, AtFlip, Blocked, Effect, write_flip_blockers
from lakehouse_dagster.flags.lifecycle_facts import lifecycle_words
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.tracking import sync_log
from lakehouse_dagster.tracking.datasets import fragments, scopes, stamps

log = logging.getLogger("lakehouse_dagster.native_guard")

ALREADY_NATIVE = "already native"
NEW_AND_EMPTY = "new and empty"
FLIPPING = "first native write"

_CLASSIFY = fragments.classify_query(sync_log.MIRRORED_ONCE)


def classify(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, tuple]:
    """{id: (id, name, workspace id, kind, state)}: state is ALREADY_NATIVE, NEW_AND_EMPTY or FLIPPING."""
    return {r[0]: r for r in conn.execute(_CLASSIFY, (list(dataset_ids),)).fetchall()}


def native_blockers(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID]) -> list[Blocked]:
    """Why each of these datasets must not be written iceberg-native now (empty: all may be)."""
    return [b for b, _ in _blockers(conn, dataset_ids)]


def _blockers(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID]) -> list[tuple[Blocked, str]]:
    rows = classify(conn, dataset_ids)
    if not rows:
        return []
    info = {i: r[:4] for i, r in rows.items()}
    moved = [Effect(i, r[1], "pg", NATIVE) for i, r in rows.items()]
    out = []
    for b in write_flip_blockers(conn, moved, info):
        state = rows[b.dataset_id][4]
        reasons = b.reasons if state == FLIPPING else tuple(r for r in b.reasons if not isinstance(r, AtFlip))
        if reasons:
            out.append((Blocked(b.dataset_id, b.name, reasons), state))
    return sorted(out, key=lambda x: (x[0].name, str(x[0].dataset_id)))


def unsafe_native_datasets(conn: psycopg.Connection) -> tuple[int, list[Blocked]]:
    """(how many datasets are written natively, those among them that fail the gates that apply). A manifest dataset
    under a native workspace or global writer is outside the write flip (its writer is dataset.manifest, locked to pg):
    not counted."""
    native = native_dataset_ids(conn)
    if native:
        native = scopes.tabular_among(conn, native)
    return len(native), native_blockers(conn, native) if native else []


def refusal_text(writer: str, blocked: Blocked, state: str = FLIPPING, lifecycle: str | None = None) -> str:
    """The one-line refusal of a native write: the reasons joined, and the ways forward for its state;
    ``lifecycle`` names the dataset's lifecycle state (flags.lifecycle_words)."""
    pin = f"lakehouse write-flags set {writer} pg --dataset {blocked.dataset_id}"
    if state == FLIPPING:  # the mirror refuses a dataset while its writer resolves native: pin it to pg first
        forward = (
            f"to flip it the runbook's way, pin it to Postgres ({pin}), let the mirror catch up, read-flip "
            "and canary it, then clear the pin (the gates check it again)"
        )
    elif state == NEW_AND_EMPTY:
        forward = f"fix what the reasons say (e.g. read-flip its readers), or keep it on Postgres: {pin}"
    else:
        forward = (
            f"fix what the reasons say, or roll the writer back ({pin}; rows written natively exist only in "
            "Iceberg: lakehouse backfill)"
        )
    return (
        f"refused: {writer} would write {blocked.name} ({blocked.dataset_id})"
        f"{', ' + lifecycle + ',' if lifecycle else ''} iceberg-native, but it fails "
        f"the write-flip gates ({state}): {'; '.join(blocked.reasons)}; nothing was written — {forward}"
    )


def refuse_unsafe_native_write(
    conn: psycopg.Connection,
    writer: str,
    dataset_id: uuid.UUID,
    *,
    iceberg_mode: str | None,
    sync_id: uuid.UUID | None = None,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
) -> None:
    """Raise FlipRefused, after recording it, when the dataset fails the gates that apply to it.

    Recorded like a failed native write (fail loud): an ``iceberg_sync_log`` row ``failed`` with the refusal
    as its error, the dataset ``errored`` with the same text. Nothing is written to Iceberg or dataset_rows.
    """
    blocked = _blockers(conn, [dataset_id])
    if not blocked:
        return
    message = refusal_text(writer, *blocked[0], lifecycle=lifecycle_words(conn, [dataset_id]).get(dataset_id))
    with conn.transaction():
        # a retry's earlier row is the reaper's to settle
        sync_log.record_refused_native(conn, dataset_id, sync_id or uuid.uuid4(), writer, iceberg_mode, message)
        stamps.mark_errored(conn, dataset_id, message)
    (logger or log).error(f"[write-router] {message}")
    raise FlipRefused(message)


def report_lines(blocked: list[Blocked]) -> list[str]:
    """One line per native-unsafe dataset: its name, id and the reasons (what the sensor and its run show)."""
    return [f"{b.name} ({b.dataset_id}): {'; '.join(b.reasons)}" for b in blocked]


def report_key(blocked: list[Blocked]) -> str:
    """A short stable digest of what is unsafe and why: a new report only when it changes."""

    return hashlib.sha256("\n".join(report_lines(blocked)).encode()).hexdigest()[:16]
