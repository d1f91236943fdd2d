"""The canary of a writer's FIRST native sync (runbook Fase 4, step 3): does the new snapshot hold what
Postgres held?

Right after a write flip, Postgres still holds exactly what the mirror last wrote, and stops changing
(the writer is native, the mirror skips the dataset). The first native sync then writes the table
from the source:

  * ``sync.full`` replaces the table. From an unchanged source it must hold the same rows as Postgres,
    but with identity assigned anew — ``__row_id`` and ``__created_at`` are fresh, and ``__row_index``
    follows the source's order, which need not be the order the rows were first written in. So the
    comparison is over the CONTENT columns only: the order-independent digest (count, sum of row
    hashes) of the dataset's typed columns, the same canonical text as the canary with the identity
    fields left out (parity/canonical.py, ``identity=False``). A duplicated or missing row still shows
    (a sum, not a set).
  * the appending writers (sync.append, sync.incremental, cdc.append) add rows above Postgres' max
    ``row_index``. The rows up to it must be untouched: the full canary digest (identity included) of
    that ``row_index`` range on both sides; the rows appended are counted, not compared (Postgres never
    had them).

Verdicts: ``ok`` or ``MISMATCH`` (``no-snapshot`` / ``error`` when it cannot tell). Every verdict goes to
``lakehouse_read_parity`` (source ``first-native-sync``) through canary.record, like any canary's.
"""

from __future__ import annotations

import time
import uuid

from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.errors import BadInput, NotFound
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.registry import WRITE, get_flag
from lakehouse_dagster.parity import canary
from lakehouse_dagster.parity.digest import (
    IcebergSide,
    PgSide,
    PinnedPostgres,
    fold,
    pin_iceberg,
    plain_digest,
    schema_problems,
)

SOURCE = "first-native-sync"


def evaluate_first_native(
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    dataset_id,
    writer: str,
    *,
    snapshot_id: int | None = None,
) -> canary.Verdict:
    """The verdict for the dataset's current snapshot, expected to be ``snapshot_id`` (nothing recorded)."""
    ds_id = parse_uuid(dataset_id, "dataset id")
    replace = get_flag(WRITE, writer).iceberg_mode == "replace"
    started = time.perf_counter()
    v = canary.Verdict(ds_id, "", canary.ERROR)
    v.detail["writer"] = writer
    v.detail["compare"] = (
        "content columns (identity assigned anew)"
        if replace
        else "rows up to Postgres' max row_index, identity included (rows above it were appended)"
    )
    try:
        _evaluate(dsn, catalog, settings, ds_id, replace, snapshot_id, v)
    except (NotFound, BadInput):
        raise
    except Exception as exc:  # the check could not see the data: never a pass
        v.verdict = canary.ERROR
        v.detail["reason"] = canary._one_line(exc)
    v.seconds = round(time.perf_counter() - started, 3)
    return v


def _evaluate(dsn, catalog, settings, ds_id: uuid.UUID, replace: bool, snapshot_id, v: canary.Verdict) -> None:
    pin = pin_iceberg(catalog, settings, ds_id)
    v.snapshot_id, v.iceberg_version = pin.snapshot_id, pin.source_version
    with PinnedPostgres(dsn, dataset_id=ds_id) as pg:
        state = pg.state(ds_id)
        if state is None:
            raise NotFound(f"dataset {ds_id} does not exist (check the id with: lakehouse datasets)")
        if state.kind != "tabular":
            raise BadInput(f"dataset {ds_id} is a {state.kind} dataset; the canary checks tabular datasets")
        v.dataset, v.pg_version = state.name, state.rows_version
        if not pin.has_snapshot:
            v.verdict = canary.NO_SNAPSHOT
            v.detail["reason"] = "the Iceberg table has no snapshot: the native sync did not commit"
            return
        if snapshot_id is not None and pin.snapshot_id != snapshot_id:
            v.detail["note"] = (
                f"the table moved on from the first native snapshot {snapshot_id}; checked the current one"
            )
        problems = schema_problems(pin, state.columns)
        if problems:
            v.verdict, v.detail["reason"] = canary.MISMATCH, "; ".join(problems)
            return
        pg_side = PgSide(pg.conn, ds_id, state.columns, identity=not replace)
        pg_side.self_check()
        with IcebergSide(pin, state.columns, identity=not replace) as ice:
            if replace:
                pg_d, ice_d = plain_digest(pg_side).value, plain_digest(ice).value
                scope = "content"
            else:
                pg_lo, pg_hi = pg_side.bounds()
                hi = -1 if pg_hi is None else pg_hi
                lo = min(x for x in (pg_lo, ice.bounds()[0], 0) if x is not None)
                width = max(hi + 1 - lo, 1)  # one segment: the digest of [lo, hi]
                pg_d = fold(pg_side.segment_digests(lo, hi + 1, width))
                ice_d = fold(ice.segment_digests(lo, hi + 1, width))
                v.detail["appended_rows"] = (pin.total_records or 0) - pg_d[0]
                scope = f"row_index {lo}..{hi}"
        (v.pg_count, v.pg_digest), (v.iceberg_count, v.iceberg_digest) = pg_d, ice_d
        if pg_d == ice_d:
            v.verdict = canary.OK
            v.detail["reason"] = (
                f"first native snapshot {pin.snapshot_id} holds the {pg_d[0]} row(s) Postgres held "
                f"({scope}: counts and digests match)"
            )
        else:
            v.verdict = canary.MISMATCH
            v.detail["reason"] = (
                f"first native snapshot {pin.snapshot_id} differs from what Postgres held ({scope}): "
                f"Postgres {pg_d[0]} rows / digest {pg_d[1]}, Iceberg {ice_d[0]} rows / digest "
                f"{ice_d[1]}"
            )


def rollback_command(writer: str, dataset_id: uuid.UUID) -> str:
    return f"lakehouse write-flags set {writer} pg --dataset {dataset_id}"
