"""What one write commits (lake/writer.py): the marks its commit records, the table properties every commit sets, the
plan a caller decides (``TableWrite``) and the result it gets back.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Mapping, Sequence

SOURCE_VERSION = "lakehouse.source-version"
MAX_ROW_INDEX = "lakehouse.max-row-index"
WRITE_PATH = "lakehouse.path"
WRITE_MODE = "lakehouse.mode"  # replace | append | partial (the snapshot summary; a sync reports it)

COMMIT_RETRIES = "commit.retry.num-retries"
COMMIT_ATTEMPTS = 6  # our G4: attempts of one commit after lost compare-and-swaps (backoff with jitter)
# The name of every data file this writer writes (_FileRoller._open): the sync it belongs to, then its number.
SYNC_FILE = re.compile(r"^lakehouse-([0-9a-f-]{36})-\d+\.parquet$")

# An incremental sync appends a manifest; without merging, a long-lived mirror's current snapshot lists one
# per append and every scan plan reads them all (400 appends: planning 7.4× slower, bench_snapshot_growth.py).
# Set on every commit, so tables created before it merge too: at 16 manifests they are merged into files of up
# to 8 MB (pyiceberg's default); 100, the default count, still left planning ~80 ms for a 1,000-row table.
MERGE_MANIFESTS = {"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "16"}

# Old metadata files: every commit writes a new one holding the whole history, so without this a long-lived
# table's metadata directory grows with the square of its commits; Iceberg's own defaults once enabled.
METADATA_FILES = {"write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "100"}


TABLE_DEFAULTS = {
    "format-version": "2",
    "write.parquet.compression-codec": "zstd",
    COMMIT_RETRIES: "0",  # see the module docstring: retries are ours, guard-checked
}


@dataclasses.dataclass(frozen=True)
class WriteResult:
    snapshot_id: int | None
    rows: int  # rows written by this call
    bytes: int
    files: int
    total_rows: int  # rows in the table after the commit
    committed: bool  # False when the sync's snapshot was already there (a retry) or nothing was written
    source_version: int | None = None  # the version the snapshot covers (a retry: what attempt 1 wrote)
    rewritten: int = 0  # of ``rows``, those of the files a partial rewrite (or a compaction) replaced
    # What the caller's ``digester`` folded per written file (data file path -> its digest); the caller stores it
    # (parity/write_digests.py: write_digested).
    file_digests: dict = dataclasses.field(default_factory=dict)
    location: str | None = None  # the table's location (Table.location()): where its files live


@dataclasses.dataclass(frozen=True)
class CommitEntries:
    """Table properties and snapshot-summary entries a commit records besides the writer's own. A source writer
    knows them only once its rows are read (its cursor, its highest __row_index): its batch generator returns
    them (``write_arrow``)."""

    props: Mapping[str, str] = dataclasses.field(default_factory=dict)
    summary: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TableWrite:
    """What one ``write_arrow`` call commits, decided by the caller before the first row is written.

    ``mode``: "replace" makes the table hold exactly the rows written; "append" adds them; "partial" removes
    ``delete_files`` (DataFiles of the current snapshot) and adds the rows in the same snapshot (the mirror's
    rewrite, tracking/row_changes.py; a native compaction, routing/native_table.py). ``sync_id`` names the
    commit (a retry finds it); ``source_version`` is the version the snapshot covers; ``path`` "mirror" or
    "native" (every commit records it, mirror/native_run.py). ``max_row_index``: the table's highest
    __row_index after the commit (None: the table's until now, -1 for a replace). ``chunk_rows``: rows per data
    file (None: settings.sync.chunk_rows). ``lanes``: _FileRoller. ``revert_foreign`` (a mirror replace only):
    commit even when another engine changed the table's rows since the project's last commit (lake/foreign.py),
    reverting that change; the commit names the snapshots it reverted in its summary. Without it a mirror commit
    refuses them (ForeignCommit)."""

    mode: str
    sync_id: uuid.UUID
    source_version: int | None
    path: str = "mirror"
    max_row_index: int | None = None
    chunk_rows: int | None = None
    delete_files: Sequence = ()
    lanes: Sequence[int] | None = None
    revert_foreign: bool = False

    def __post_init__(self):
        if self.mode not in ("replace", "append", "partial"):
            raise ValueError(f"mode must be 'replace', 'append' or 'partial', not {self.mode!r}")
        if self.revert_foreign and (self.mode != "replace" or self.path != "mirror"):
            raise ValueError("only a mirror replace reverts another engine's commits (revert_foreign)")

    @property
    def replaces(self) -> bool:
        return self.mode == "replace"

    @property
    def rewritten(self) -> int:
        """Rows of the files a partial commit removes (their rows are among the rows it writes)."""
        return sum(f.record_count for f in self.delete_files) if self.mode == "partial" else 0


@dataclasses.dataclass(frozen=True)
class _Staged:
    """Every file of a write, closed and described, and what its commit records; nothing committed yet."""

    data_files: list
    nbytes: int
    total_rows: int  # rows in the table after the commit
    props: dict
    summary: dict
