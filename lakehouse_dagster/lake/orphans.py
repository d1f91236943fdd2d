"""Files in a table's directory that no kept snapshot references, and their removal (an operator's command).

Snapshot expiry (writer.expirable_snapshots) removes snapshots from the metadata only, and a compaction, partial
rewrite or overwrite replaces data files without deleting them: both keep whatever a reader that chose a
snapshot a moment ago still needs. What no kept snapshot references is left on disk; this finds it.

A file is an orphan only when all of these hold, so a sweep never takes what anything may still read or commit:
  * it is a data file (``data/*.parquet``), a manifest or manifest list (``metadata/*.avro``), or a metadata
    file (``metadata/*.metadata.json``) that is neither the current one nor in its metadata log — one a commit
    wrote and then lost the compare-and-swap with, or was killed before; those in the log are pyiceberg's to
    delete (write.metadata.delete-after-commit, writer.METADATA_FILES);
  * no snapshot in the table's current metadata references it (its manifest list, its manifests, the data files
    it holds), loaded right before the listing;
  * it was last modified longer ago than the grace period (a sync writes its files before it commits, and a
    reader holds a snapshot while it reads: both take far less than the default hour);
  * for a data file named after its sync (``lakehouse-<sync id>-N.parquet``), that sync is not running or
    unsettled in iceberg_sync_log (the reaper settles those, mirror/reaper.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from pyarrow import fs as pafs
from pyiceberg.table import Table

from lakehouse_dagster.lake.storage import table_filesystem
from lakehouse_dagster.lake.writer import SYNC_FILE


@dataclasses.dataclass(frozen=True)
class Orphan:
    path: str
    size: int
    modified: dt.datetime


def referenced(table: Table) -> set[str]:
    """The current metadata file and those in its log, every manifest list and manifest of every snapshot in the
    metadata, and every data file one of them holds
    (a manifest's DELETED entries name files its snapshot no longer has: the snapshot before it lists them as
    live, if it is kept)."""
    refs: set[str] = {table.metadata_location, *(entry.metadata_file for entry in table.metadata.metadata_log)}
    seen_manifests: set[str] = set()
    for snap in table.metadata.snapshots:
        refs.add(snap.manifest_list)
        for manifest in snap.manifests(table.io):
            refs.add(manifest.manifest_path)
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                refs.add(entry.data_file.file_path)
    return refs


def find_orphans(
    table: Table, *, grace_seconds: float, protected_syncs: set[str], now: dt.datetime | None = None
) -> list[Orphan]:
    """The table's orphan files (see the module docstring), oldest first."""

    now = now or dt.datetime.now(dt.UTC)
    cutoff = now - dt.timedelta(seconds=grace_seconds)
    refs = referenced(table)
    # metadata files by name too (unique per table): the catalog's spelling of their location is not ours
    metadata_names = {r.rsplit("/", 1)[-1] for r in refs if r.endswith(".metadata.json")}
    filesystem, root = table_filesystem(table, table.location())
    found: list[Orphan] = []
    for sub, suffixes in (("data", (".parquet",)), ("metadata", (".avro", ".metadata.json"))):
        base = f"{table.location()}/{sub}"
        for info in filesystem.get_file_info(pafs.FileSelector(f"{root}/{sub}", allow_not_found=True)):
            if info.type != pafs.FileType.File or not info.base_name.endswith(suffixes):
                continue
            path = f"{base}/{info.base_name}"
            modified = info.mtime if info.mtime.tzinfo else info.mtime.replace(tzinfo=dt.UTC)
            if path in refs or info.base_name in metadata_names or modified > cutoff:
                continue
            m = SYNC_FILE.match(info.base_name)
            if m and m.group(1) in protected_syncs:
                continue
            found.append(Orphan(path, info.size, modified))
    return sorted(found, key=lambda o: o.modified)


def remove(table: Table, orphans: list[Orphan]) -> int:
    """Delete them; how many went (a file already gone is not an error)."""
    removed = 0
    for o in orphans:
        try:
            table.io.delete(o.path)
            removed += 1
        except FileNotFoundError:
            pass
    return removed
