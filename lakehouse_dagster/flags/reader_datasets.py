"""Which datasets the Postgres-held readers read: declared by operators, so a write flip cannot strand them.

Readers whose ceiling is below iceberg (sdk.files.list, mediaset.item) read ``dataset_rows`` and nothing else; the
compute readers (objects.sync, dashboards.aggregate, pipeline.expectations: registry ``proof``) read it until they are
flipped for the dataset, which needs proven shadow consistency (flags/proof.py). Once a writer goes iceberg_native
for a dataset, Postgres goes stale for it. Nothing in the app says which datasets they read, so an operator declares
it (``lakehouse pg-readers add <reader> --dataset <id> | --workspace <id>``); a workspace declaration covers every
dataset of the workspace, including ones created later. A declared reader holds a dataset on Postgres only while its
effective mode for that dataset is below iceberg (``on_postgres``): the flip gates (gates.py) refuse a write flip
and ``complete`` refuses a dataset it holds, naming the reader; a compute reader flipped for it holds nothing.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime

import psycopg

from lakehouse_dagster.core.db import fetch_one
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.flags.overrides import (
    DATASET,
    GLOBAL,
    WORKSPACE,
    Scope,
    _check_actor,
    _check_note,
    parse_scope,
    require_target,
)
from lakehouse_dagster.flags.registry import READ, READERS, get_flag, rank, reads_postgres
from lakehouse_dagster.flags.stored import resolve_for, stored_overrides


def locked_readers() -> list[str]:
    """Readers Iceberg cannot serve (ceiling below iceberg): they stay on dataset_rows whatever their flag."""
    return [r.name for r in READERS.values() if rank(READ, r.ceiling) < rank(READ, "iceberg")]


def declarable_readers() -> list[str]:
    """The readers declared here: the locked ones and the compute readers (on dataset_rows until proven, flipped)."""
    return [r.name for r in READERS.values() if rank(READ, r.ceiling) < rank(READ, "iceberg") or r.proof]


PROOF_NOTE = "mode {mode}: on Postgres until flipped, once its shadow reads prove it"


@dataclasses.dataclass(frozen=True)
class Declared:
    reader: str
    scope: str  # dataset | workspace
    scope_id: uuid.UUID
    note: str | None
    declared_by: str
    declared_at: datetime
    mode: str | None = dataclasses.field(default=None, compare=False)  # its effective mode for the dataset asked

    def as_dict(self) -> dict:
        d = {**dataclasses.asdict(self), "scope_id": str(self.scope_id)}
        if self.mode is None:
            del d["mode"]
        return d

    def describe(self) -> str:
        via = "" if self.scope == DATASET else f" (declared for its workspace {self.scope_id})"
        flag = READERS.get(self.reader)
        if self.mode is not None and flag is not None and flag.proof:
            return f"{self.reader}{via} ({PROOF_NOTE.format(mode=self.mode)})"
        return f"{self.reader}{via}"


def _check_reader(name: str) -> str:
    flag = get_flag(READ, name)
    if flag.name not in declarable_readers():
        raise BadInput(
            f"{name} can be served by Iceberg (ceiling {flag.ceiling}): read-flip it instead "
            f"(lakehouse flags flip {name}); only readers that stay on Postgres are declared here: "
            + ", ".join(declarable_readers())
        )
    return flag.name


def _scope(dataset, workspace) -> Scope:
    scope = parse_scope(dataset, workspace)
    if scope.scope == GLOBAL:
        raise BadInput("give --dataset <id> or --workspace <id>: the datasets this reader reads")
    return scope


def declare(
    conn: psycopg.Connection, reader: str, *, dataset=None, workspace=None, note: str | None = None, actor: str
) -> Declared:
    """Record that ``reader`` reads a dataset (or every dataset of a workspace); re-declaring updates the note."""
    reader = _check_reader(reader)
    scope = _scope(dataset, workspace)
    note, actor = _check_note(note), _check_actor(actor)
    require_target(conn, scope)
    row = fetch_one(
        conn.execute(
            "insert into lakehouse_reader_datasets (reader, scope, scope_id, note, declared_by) values (%s, %s, %s, %s, %s)"
            " on conflict (reader, scope, scope_id) do update set note = excluded.note, declared_by = excluded.declared_by,"
            " declared_at = now() returning reader, scope, scope_id, note, declared_by, declared_at",
            (reader, scope.scope, scope.scope_id, note, actor),
        ),
        "the reader declaration just written",
    )
    return Declared(*row)


def declare_if_absent(conn: psycopg.Connection, reader: str, dataset_id, note: str, actor: str) -> None:
    """Record that ``reader`` reads one dataset unless that is already recorded (the demo's seed: a re-run keeps
    what stands)."""
    conn.execute(
        "insert into lakehouse_reader_datasets (reader, scope, scope_id, note, declared_by)"
        " values (%s, 'dataset', %s, %s, %s) on conflict do nothing",
        (reader, dataset_id, note, actor),
    )


def remove(conn: psycopg.Connection, reader: str, *, dataset=None, workspace=None) -> bool:
    """Drop a declaration (the reader no longer reads it); False when there was none."""
    reader = get_flag(READ, reader).name
    scope = _scope(dataset, workspace)
    return (
        conn.execute(
            "delete from lakehouse_reader_datasets where reader = %s and scope = %s and scope_id = %s",
            (reader, scope.scope, scope.scope_id),
        ).rowcount
        > 0
    )


def declared(conn: psycopg.Connection, reader: str | None = None) -> list[Declared]:
    sql = "select reader, scope, scope_id, note, declared_by, declared_at from lakehouse_reader_datasets"
    params: tuple = ()
    if reader is not None:
        sql += " where reader = %s"
        params = (get_flag(READ, reader).name,)
    return [Declared(*r) for r in conn.execute(sql + " order by reader, scope, scope_id", params).fetchall()]


def readers_of(
    conn: psycopg.Connection, datasets: dict[uuid.UUID, uuid.UUID | None]
) -> dict[uuid.UUID, list[Declared]]:
    """{dataset: the locked readers declared to read it}, for {dataset id: its workspace id}, in one query."""
    if not datasets:
        return {}
    rows = conn.execute(
        "select reader, scope, scope_id, note, declared_by, declared_at from lakehouse_reader_datasets"
        " where (scope = 'dataset' and scope_id = any(%s::uuid[])) or (scope = 'workspace' and scope_id = any(%s::uuid[]))"
        " order by reader, scope",
        (list(datasets), list({w for w in datasets.values() if w is not None})),
    ).fetchall()
    by_ws: dict[uuid.UUID, list[Declared]] = {}
    out: dict[uuid.UUID, list[Declared]] = {}
    for r in rows:
        d = Declared(*r)
        if d.scope == WORKSPACE:
            by_ws.setdefault(d.scope_id, []).append(d)
        else:
            out.setdefault(d.scope_id, []).append(d)
    for ds_id, ws_id in datasets.items():
        if ws_id in by_ws:
            out.setdefault(ds_id, []).extend(by_ws[ws_id])
    return out


def on_postgres(
    conn: psycopg.Connection, datasets: dict[uuid.UUID, uuid.UUID | None]
) -> dict[uuid.UUID, list[Declared]]:
    """``readers_of`` less the readers that read Iceberg for the dataset now (a compute reader flipped for it): the
    declared readers that hold each dataset on ``dataset_rows``, each with its effective mode. Two queries."""
    found = readers_of(conn, datasets)
    names = sorted({d.reader for ds in found.values() for d in ds if d.reader in READERS})
    stored = stored_overrides(conn, READ, names) if names else {}
    out: dict[uuid.UUID, list[Declared]] = {}
    for ds_id, decls in found.items():
        for d in decls:
            flag = READERS.get(d.reader)
            mode = resolve_for(flag, stored[d.reader], ds_id, datasets[ds_id]) if flag is not None else None
            if mode is None or reads_postgres(mode):
                out.setdefault(ds_id, []).append(dataclasses.replace(d, mode=mode))
    return out
