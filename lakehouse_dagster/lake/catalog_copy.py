"""One table moved from one Iceberg catalog to another without rewriting a data file (`lakehouse catalog migrate`).

Two ways, both through pyiceberg's Catalog API, so either direction works (SQL → REST, and REST → SQL, the way back):

``register``: the target catalog adopts the source's current metadata file (``register_table``), one atomic call; the
table is then the same table (same uuid, same files, same metadata file). A catalog whose ``register_table`` does not
read the file it is given is caught by the verification (SeaweedFS 4.48 answers with an empty table: no schema, no
snapshot) and the registration is dropped again.

``replay``: the target catalog creates the table and receives the source's schemas, snapshots, refs and properties in
the same commit (a staged create: atomic, nothing visible before it lands). The snapshots are the source's own
(their ids, sequence numbers and manifest lists; a timestamp older than the new table is moved up to it, which a
catalog requires), so the manifests and data files are the source's files, untouched;
only a new metadata file is written, in the target's location. A table already replayed and behind its source (the
source's writers went on) is caught up by a commit adding the snapshots it lacks, guarded by the target's current
snapshot (a concurrent writer there makes it fail, nothing half-applied).

Either way the caller verifies (``verify``) that the target serves what the source holds: the current snapshot, the
live data files (the same paths: nothing rewritten), the schema and the properties.
"""

from __future__ import annotations

import dataclasses

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    RemovePropertiesUpdate,
    SetCurrentSchemaUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)

from lakehouse_dagster.core import private_apis
from lakehouse_dagster.lake.catalog import ensure_namespace, load_table_or_none
from lakehouse_dagster.lake.errors import CopyRefused

# (the type: ignore[call-arg] below: pyiceberg's update models take their field names, populate_by_name; the
# pydantic plugin knows only their aliases, "schema", "schema-id"...)

HOWS = ("register", "replay")
# The table properties the project writes (lake/writer.py, lake/foreign.py): the target holds exactly the source's.
# Others a catalog may add of its own (SeaweedFS adds schema.name-mapping.default); they are left to it.
OURS = "lakehouse."


@dataclasses.dataclass(frozen=True)
class Plan:
    """What moving one table would do: ``action`` create | catch-up | already | diverged; ``snapshots`` to add."""

    action: str
    snapshots: int = 0
    reason: str = ""


def plan(source: Table, target: Table | None) -> Plan:
    """What ``copy_table`` would do, without doing it (the dry-run)."""
    if target is None:
        return Plan("create", len(source.metadata.snapshots))
    src, dst = source.metadata, target.metadata
    if (
        dst.current_snapshot_id == src.current_snapshot_id
        and _same_schema(target, source)
        and not _other_properties(source, target)
    ):
        return Plan("already")
    known = {s.snapshot_id for s in src.snapshots}
    if dst.current_snapshot_id is not None and dst.current_snapshot_id not in known:
        return Plan(
            "diverged",
            reason=f"the target's current snapshot {dst.current_snapshot_id} is not one of the source's: "
            "written on both sides (or expired on the source)",
        )
    have = {s.snapshot_id for s in dst.snapshots}
    return Plan("catch-up", sum(1 for s in src.snapshots if s.snapshot_id not in have))


def copy_table(
    source_catalog: Catalog,
    target_catalog: Catalog,
    identifier: tuple[str, str],
    how: str,
    *,
    source: Table | None = None,
    namespaces: set[str] | None = None,
) -> tuple[Plan, Table, Table, bool]:
    """Move (or catch up) one table: (what was done, the source table, the target table after it, whether this call
    created the target's). Raises CopyRefused when it cannot, with nothing changed. ``source``: the source table as
    the caller just loaded it (not loaded again); ``namespaces``: the target's namespaces this run already made sure
    of (a catalog round trip a table saved: a migration moves hundreds into one namespace)."""
    if how not in HOWS:
        raise CopyRefused(f"--how {how!r} is not one of {', '.join(HOWS)}")
    source = source_catalog.load_table(identifier) if source is None else source
    if namespaces is None or identifier[0] not in namespaces:
        ensure_namespace(target_catalog, identifier[0])
        if namespaces is not None:
            namespaces.add(identifier[0])
    target = load_table_or_none(target_catalog, identifier)
    step = plan(source, target)
    if step.action == "diverged":
        raise CopyRefused(
            f"table {'.'.join(identifier)}: {step.reason}; compare the two tables, drop the target's (without purge) "
            "if the source is the truth, then run the migration again"
        )
    if step.action == "already":
        assert target is not None  # plan says "already" only of a table the target has
        return step, source, target, False
    if target is None and how == "register":
        return step, source, _register(source, target_catalog, identifier), True
    if target is None:
        return step, source, _replay_create(source, target_catalog, identifier), True
    return step, source, _catch_up(source, target, target_catalog), False


def _register(source: Table, target_catalog: Catalog, identifier: tuple[str, str]) -> Table:
    target = target_catalog.register_table(identifier, source.metadata_location)
    if target.metadata.table_uuid != source.metadata.table_uuid or not _same_schema(target, source):
        try:
            target_catalog.drop_table(identifier)  # never purge: the files are the source's
        except Exception as exc:  # noqa: BLE001 - said in the refusal: the operator drops it by hand
            undo = f"; dropping the registration failed too ({type(exc).__name__}): drop it by hand, without purge"
        else:
            undo = "; the registration was dropped again"
        raise CopyRefused(
            f"table {'.'.join(identifier)}: the target catalog registered {source.metadata_location} but serves "
            f"other metadata (table uuid {target.metadata.table_uuid}, not {source.metadata.table_uuid}): its "
            f"register_table does not read the file it is given{undo}; use --how replay"
        )
    return target


def _replay_create(source: Table, target_catalog: Catalog, identifier: tuple[str, str]) -> Table:
    src = source.metadata
    first = min(src.schemas, key=lambda s: s.schema_id)
    tx = target_catalog.create_table_transaction(
        identifier,
        first,
        partition_spec=source.spec(),
        sort_order=source.sort_order(),
        properties=dict(src.properties),
    )
    staged = tx.table_metadata
    if staged.schema().fields != first.fields:  # the catalog assigned other field ids than the source's
        raise CopyRefused(
            f"table {'.'.join(identifier)}: the target catalog gives its schema other field ids than the source's; "
            "register the table instead (--how register)"
        )
    # The older schemas, then the current one last (a catalog that numbers added schemas itself, as Iceberg's Java
    # catalogs do, still makes the right one current: -1 is "the last added").
    current = src.schema()
    older = [x for x in src.schemas if x.schema_id not in (first.schema_id, current.schema_id)]
    updates: list[TableUpdate] = [AddSchemaUpdate(schema_=x) for x in older]  # type: ignore[call-arg]
    if current.schema_id != first.schema_id:
        updates += [AddSchemaUpdate(schema_=current), SetCurrentSchemaUpdate(schema_id=-1)]  # type: ignore[call-arg]
    elif older:
        updates.append(SetCurrentSchemaUpdate(schema_id=staged.current_schema_id))  # type: ignore[call-arg]
    updates += _snapshot_updates(src, set(), staged.last_updated_ms)
    private_apis.pyiceberg_stage(tx, tuple(updates), ())
    done = tx.commit_transaction()  # holds the metadata the catalog answered the commit with
    # The transaction's own table is a staged one (no scan): the same metadata as a table, without loading it again.
    return Table(identifier, done.metadata, done.metadata_location, done.io, target_catalog)


def _catch_up(source: Table, target: Table, target_catalog: Catalog) -> Table:
    src, dst = source.metadata, target.metadata
    updates: list[TableUpdate] = []
    have_schemas = {s.schema_id: s for s in dst.schemas}
    for s in src.schemas:
        if s.schema_id not in have_schemas:
            updates.append(AddSchemaUpdate(schema_=s))  # type: ignore[call-arg]
        elif have_schemas[s.schema_id].fields != s.fields:
            raise CopyRefused(f"table {target.name()}: schema {s.schema_id} differs between the catalogs")
    if not _same_schema(target, source):
        updates.append(SetCurrentSchemaUpdate(schema_id=src.current_schema_id))  # type: ignore[call-arg]
    updates += _snapshot_updates(src, {s.snapshot_id for s in dst.snapshots}, dst.last_updated_ms)
    gone = [k for k in dst.properties if k not in src.properties and k.startswith(OURS)]
    if gone:
        updates.append(RemovePropertiesUpdate(removals=gone))
    requirements: tuple[TableRequirement, ...] = (AssertRefSnapshotId(ref="main", snapshot_id=dst.current_snapshot_id),)  # type: ignore[call-arg]
    done = target_catalog.commit_table(target, requirements, tuple(updates))
    return Table(target.name(), done.metadata, done.metadata_location, target.io, target_catalog)


def _snapshot_updates(src, have: set[int], last_updated_ms: int) -> list[TableUpdate]:
    """The source's snapshots the target lacks (in sequence order, as they were committed), its refs, its properties.

    A snapshot's timestamp moves up to the target's last update when it is older: a catalog refuses a snapshot older
    than the table's last update less a minute (Iceberg's metadata builder does; SeaweedFS: "invalid snapshot
    timestamp ... before last updated timestamp"). The timestamp is the metadata's alone (no manifest holds it), so
    only time travel by timestamp and the age expiry (a moved snapshot counts as young) see the difference."""
    updates: list[TableUpdate] = []
    floor = last_updated_ms
    for s in sorted(src.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms)):
        if s.snapshot_id in have:
            continue
        if s.timestamp_ms < floor:
            s = s.model_copy(update={"timestamp_ms": floor})
        floor = s.timestamp_ms + 1
        updates.append(AddSnapshotUpdate(snapshot=s))
    for name, ref in src.refs.items():
        updates.append(SetSnapshotRefUpdate(ref_name=name, type=ref.snapshot_ref_type, snapshot_id=ref.snapshot_id))  # type: ignore[call-arg]
    updates.append(SetPropertiesUpdate(updates=dict(src.properties)))
    return updates


def _other_properties(source: Table, target: Table) -> list[str]:
    """The properties the target must take from the source: each of the source's, and the project's it lacks."""
    keys = {*source.properties, *(k for k in target.properties if k.startswith(OURS))}
    return sorted(k for k in keys if source.properties.get(k) != target.properties.get(k))


def _same_schema(a: Table, b: Table) -> bool:
    """The same current schema: its fields with their ids, names and types (its number may differ between catalogs)."""
    return a.schema().fields == b.schema().fields


def live_files(table: Table) -> set[str]:
    return {task.file.file_path for task in table.scan().plan_files()} if table.current_snapshot() else set()


def verify(source: Table, target: Table, target_files: set[str] | None = None) -> tuple[list[str], int]:
    """(what differs between the moved table and its source, empty when the target serves exactly the source's
    table; the target's live data files). ``target_files``: the target's live data files as the caller planned them
    (the canary's pin), not planned again. When the target's current snapshot names the source's own manifest list
    (a replay or a registration moves the snapshots whole), the source's files are that same immutable list's: one
    file plan, not two."""
    problems = []
    if target.metadata.current_snapshot_id != source.metadata.current_snapshot_id:
        problems.append(
            f"current snapshot {target.metadata.current_snapshot_id}, not {source.metadata.current_snapshot_id}"
        )
    if not _same_schema(target, source):
        problems.append("another schema")
    differ = _other_properties(source, target)
    if differ:
        problems.append(f"other properties ({', '.join(differ[:3])})")
    dst_files = live_files(target) if target_files is None else target_files
    src_snap, dst_snap = source.current_snapshot(), target.current_snapshot()
    same_list = src_snap is not None and dst_snap is not None and src_snap.manifest_list == dst_snap.manifest_list
    src_files = dst_files if same_list else live_files(source)
    if src_files != dst_files:
        problems.append(f"other data files ({len(dst_files ^ src_files)} differ)")
    return problems, len(dst_files)
