"""What still holds a dataset on Postgres (issue 43): per tabular dataset, the pipelines reading it as input and the
declared readers on Postgres — complete's consumer condition, from the same two sources (``pipeline_input_dataset_ids``,
``on_postgres``), so the overview's list and complete's refusal cannot disagree — and each compute reader's shadow
consistency folded over every dataset (flags/proof.py). Part of the migration overview (status/overview.py)."""

from __future__ import annotations

import dataclasses
import uuid

import psycopg

from lakehouse_dagster import lifecycle
from lakehouse_dagster.flags.proof import Proof
from lakehouse_dagster.flags.reader_datasets import declarable_readers, on_postgres
from lakehouse_dagster.flags.registry import PROVEN_READERS, READERS
from lakehouse_dagster.tracking import datasets as app_tables
from lakehouse_dagster.tracking.datasets import pipeline_input_dataset_ids

PIPELINE_INPUT = "pipeline input"
HOLDERS = (PIPELINE_INPUT, *declarable_readers())  # what can hold a dataset on Postgres
# Listed nearest the end first: a completed dataset something still reads is a fault, a native one waits only on it.
_HELD_ORDER = (
    lifecycle.COMPLETE,
    lifecycle.COMPLETING,
    lifecycle.NATIVE,
    lifecycle.RESTORING,
    lifecycle.READ_FLIPPED,
    lifecycle.MIRRORED,
    lifecycle.PG,
)


@dataclasses.dataclass(frozen=True)
class Held:
    """A dataset something still reads from ``dataset_rows``: ``complete`` is refused for it until that changes."""

    dataset_id: uuid.UUID
    name: str
    state: str  # its lifecycle state
    pipelines: tuple[str, ...]  # the pipelines reading it as input (F3)
    readers: tuple[str, ...]  # the declared readers on Postgres for it
    reasons: tuple[str, ...]  # one per reader, with its mode and, for a compute reader, its shadow proof

    @property
    def holders(self) -> tuple[str, ...]:
        return ((PIPELINE_INPUT,) if self.pipelines else ()) + self.readers

    def describe(self) -> str:
        parts = [f"pipeline input of {', '.join(self.pipelines)}"] if self.pipelines else []
        return "; ".join(parts + list(self.reasons))

    def as_dict(self) -> dict:
        return {
            "dataset_id": str(self.dataset_id),
            "name": self.name,
            "state": self.state,
            "pipelines": list(self.pipelines),
            "readers": list(self.readers),
            "why": self.describe(),
        }


@dataclasses.dataclass(frozen=True)
class ShadowSummary:
    """A compute reader's shadow reads over every dataset, each against its current schema (flags/proof.py)."""

    reader: str
    datasets: int  # datasets with a counted comparison
    proven: int  # of those, proven (in a row ≥ needed)
    matched: int
    failed: int
    needed: int

    @property
    def rate(self) -> float | None:
        counted = self.matched + self.failed
        return None if not counted else 100.0 * self.matched / counted

    def describe(self) -> str:
        if self.rate is None:
            return f"{self.reader}: no shadow read compared"
        return (
            f"{self.reader}: {self.rate:.1f}% consistent over {self.matched + self.failed} comparison(s) of "
            f"{self.datasets} dataset(s), {self.proven} proven ({self.needed} in a row)"
        )

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "rate": self.rate}


def held_on_postgres(
    conn: psycopg.Connection,
    tabular: dict[uuid.UUID, tuple],
    states: dict[uuid.UUID, str],
    all_proofs: dict[tuple[str, uuid.UUID], Proof],
    needed: int,
) -> list[Held]:
    """Every tabular dataset something still reads from ``dataset_rows`` (complete's consumer condition, per dataset),
    nearest the end of the migration first. Three queries, whatever the number of datasets."""
    inputs = pipeline_input_dataset_ids(conn) & tabular.keys()
    pipelines = pipelines_reading(conn, inputs)
    readers = on_postgres(conn, {d: ws for d, (_, ws) in tabular.items()})
    out = []
    for ds_id in inputs | readers.keys():
        decls = sorted(readers.get(ds_id, []), key=lambda d: d.reader)
        reasons = []
        for d in decls:
            why = d.describe()
            flag = READERS.get(d.reader)
            if flag is not None and flag.proof:
                why += f", shadow: {all_proofs.get((d.reader, ds_id), Proof(d.reader, ds_id)).describe(needed)}"
            reasons.append(why)
        name = tabular[ds_id][0]
        out.append(
            Held(
                ds_id,
                name,
                states.get(ds_id, lifecycle.PG),
                tuple(pipelines.get(ds_id, ["a pipeline"])) if ds_id in inputs else (),
                tuple(dict.fromkeys(d.reader for d in decls)),
                tuple(reasons),
            )
        )
    rank = {s: i for i, s in enumerate(_HELD_ORDER)}
    return sorted(out, key=lambda h: (rank.get(h.state, len(rank)), h.name, str(h.dataset_id)))


def shadow_summaries(all_proofs: dict[tuple[str, uuid.UUID], Proof], needed: int) -> list[ShadowSummary]:
    """Per compute reader, its proofs over every dataset folded into one line (registry order)."""
    out = []
    for r in PROVEN_READERS:
        mine = [p for (reader, _), p in all_proofs.items() if reader == r.name and p.matched + p.failed]
        out.append(
            ShadowSummary(
                r.name,
                len(mine),
                sum(p.proven(needed) for p in mine),
                sum(p.matched for p in mine),
                sum(p.failed for p in mine),
                needed,
            )
        )
    return out


def pipelines_reading(conn: psycopg.Connection, ids: set[uuid.UUID]) -> dict[uuid.UUID, list[str]]:
    """{dataset: names of the pipelines reading it as INPUT} (the runbook's `dataset` spec nodes), one query."""
    if not ids:
        return {}
    rows = app_tables.pipelines_reading(conn, list(ids))
    return {r[0]: list(r[1]) for r in rows}
