"""One write's commit (lake/writer.py): properties and one snapshot in one transaction, G4's retry of a lost compare-
and-swap, snapshot expiry in the same commit, and finding a sync's snapshot after an unknown outcome.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Callable, Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update import update_table_metadata
from pyiceberg.table.update.snapshot import ExpireSnapshots

from lakehouse_dagster.core import private_apis
from lakehouse_dagster.core.errors import (
    SyncFailed,
    first_line,
)
from lakehouse_dagster.core.failpoints import failpoint, is_armed
from lakehouse_dagster.core.guards import check_held
from lakehouse_dagster.lake.foreign import SYNC_ID, table_row_count
from lakehouse_dagster.lake.write_plan import (
    COMMIT_ATTEMPTS,
    MAX_ROW_INDEX,
    MERGE_MANIFESTS,
    METADATA_FILES,
    SOURCE_VERSION,
)


def expirable_snapshots(metadata, keep: int, max_age_seconds: float, now_ms: int) -> list[int]:
    """The snapshots a mirror commit removes from the table metadata (every snapshot adds ~0.8 KB that each
    later commit writes and each load parses): those past the newest ``keep`` (``metadata`` is the commit's
    staged state, its own new snapshot among them) AND older than ``max_age_seconds``, never a branch or tag
    head; ``keep`` 0: none. Only the metadata goes: data and manifest files stay, so a reader that chose a
    snapshot before it was expired and holds its table still reads it. A native commit expires only when
    it carries its run's totals (mirror/native_run.py): the rollback's walk over native snapshots ends
    at the newest commit that carries them, so it needs none of the snapshots they sum."""
    if keep <= 0:
        return []
    protected = {ref.snapshot_id for ref in metadata.refs.values()}
    by_age = sorted(metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0))
    cutoff = now_ms - max_age_seconds * 1000
    return [
        s.snapshot_id
        for s in by_age[: max(0, len(by_age) - keep)]
        if s.timestamp_ms < cutoff and s.snapshot_id not in protected
    ]


def sync_snapshot(table: Table, sync_id: uuid.UUID):
    """The snapshot a sync already committed, or None (a retry after a lost response must not append twice)."""
    wanted = str(sync_id)
    for snap in reversed(table.snapshots()):
        if snap.summary is not None and snap.summary.additional_properties.get(SYNC_ID) == wanted:
            return snap
    return None


def find_sync_snapshot(table: Table, sync_id: uuid.UUID) -> int | None:
    snap = sync_snapshot(table, sync_id)
    return snap.snapshot_id if snap is not None else None


def snapshot_source_version(snap) -> int | None:
    """The source version a snapshot covers (its summary), None when it does not say."""
    raw = snap.summary.additional_properties.get(SOURCE_VERSION) if snap is not None and snap.summary else None
    try:
        return int(raw) if raw is not None and int(raw) >= 0 else None
    except ValueError:
        return None


def _look_for(catalog: Catalog, table: Table, sync_id: uuid.UUID) -> tuple[int | None, str]:
    """Reload the table and look for the sync's snapshot: (its id or None, "" or why the table could not be
    read, as a clause of one line)."""
    try:
        return find_sync_snapshot(catalog.load_table(table.name()), sync_id), ""
    except Exception as exc:  # noqa: BLE001 - unknown stays unknown
        return None, f" and the table could not be reloaded ({type(exc).__name__}: {first_line(exc)})"


def _row_count(table: Table) -> int:
    return table_row_count(table)  # another engine's commit does not move our property (lake/foreign.py)


def _max_row_index(table: Table, mode: str) -> int:
    return -1 if mode == "replace" else int(table.properties.get(MAX_ROW_INDEX, -1))


class _Transaction(Transaction):
    """pyiceberg's Transaction, with ``table_metadata`` computed once per staged state instead of on every
    access: pyiceberg rebuilds it (the updates applied to the base, then a deep copy of the whole metadata,
    every snapshot included) each time, and one fast append reads it about 14 times (~40% of a small commit).
    The value depends only on the base metadata and the staged updates, and pyiceberg treats it as read-only
    (frozen models, containers copied on update), so the same object is handed out until either changes."""

    _memo: tuple | None = None

    @property
    def table_metadata(self):
        base, updates = private_apis.pyiceberg_staged_state(self)  # pyiceberg keeps both private
        memo = self._memo
        if memo is None or memo[0] is not base or memo[1] is not updates:
            memo = self._memo = (base, updates, update_table_metadata(base, updates))
        return memo[2]


def _commit(  # noqa: C901
    table: Table,
    data_files,
    *,
    replace: bool,
    summary: dict,
    props: dict,
    sync_id: uuid.UUID,
    delete_files: Sequence | None = None,
    expire: tuple[int, float] | None = None,
    run_entries: Callable[[Table], dict] | None = None,
    foreign: Callable[[Table], dict] | None = None,
) -> int:
    """One transaction: properties + one snapshot. Long on purpose: each attempt's re-checks (guards, another
    engine's commits) sit beside the commit they guard. G4: a lost compare-and-swap is retried from a fresh
    table state (a replace re-plans which files it removes) with backoff, after re-checking that this
    sync still holds its guard locks; past the attempts CommitFailedException propagates (transient).
    ``delete_files`` (a partial rewrite): an overwrite removing exactly those files, which must all still
    be live (else ValidationException: the plan is stale, nothing is committed). ``expire``: (keep, max age
    in seconds) of ``expirable_snapshots``, removed in the same commit. ``run_entries(table)``: a native
    commit's run totals (rollback/iceberg_only.native_run), summed on each attempt's own table state.
    ``foreign(table)`` (a mirror commit: _foreign_check): refuses another engine's data change on each attempt's own
    table state (one that landed while this commit was being prepared wins the compare-and-swap, and the retry sees
    it), or returns the summary entries that name what the commit reverts."""
    for attempt in range(COMMIT_ATTEMPTS):
        check_held()
        extra = foreign(table) if foreign is not None else {}
        tx = _Transaction(table)
        tx.set_properties({**MERGE_MANIFESTS, **METADATA_FILES, **props})
        snapshot_update = tx.update_snapshot(
            snapshot_properties={**summary, **extra, **(run_entries(table) if run_entries is not None else {})}
        )
        if delete_files is not None:
            live = {task.file.file_path for task in table.scan().plan_files()} if delete_files else set()
            gone = [f.file_path for f in delete_files if f.file_path not in live]
            if gone:
                stale = ValidationException(
                    f"{len(gone)} file(s) to rewrite are no longer in the table (first: "
                    f"{gone[0]}); the partial rewrite was planned on a stale snapshot"
                )
                stale.transient = True  # type: ignore[attr-defined]  # the next sync plans on the table as it is
                raise stale
            with snapshot_update.overwrite() as producer:
                for f in delete_files:
                    producer.delete_data_file(f)
                for df in data_files:
                    producer.append_data_file(df)
        elif replace:
            with snapshot_update.overwrite() as producer:
                for task in table.scan().plan_files():
                    producer.delete_data_file(task.file)
                for df in data_files:
                    producer.append_data_file(df)
        else:
            with snapshot_update.merge_append() as producer:
                for df in data_files:
                    producer.append_data_file(df)
        expired = expirable_snapshots(tx.table_metadata, *expire, now_ms=int(time.time() * 1000)) if expire else []
        if expired:
            ExpireSnapshots(tx).by_ids(expired).commit()  # staged in this transaction: one commit
        try:
            with _commit_failpoints(table):
                tx.commit_transaction()
            break
        except (CommitFailedException, ValueError) as exc:
            fresh = table.refresh()
            if isinstance(exc, ValueError) and not _expired_meanwhile(fresh, expired, sync_id):
                raise
            table = fresh  # a lost compare-and-swap, or snapshots expired meanwhile: nothing committed either way
            found = find_sync_snapshot(table, sync_id)
            if found is not None:
                return found
            if attempt == COMMIT_ATTEMPTS - 1:
                if isinstance(exc, ValueError):
                    raise CommitFailedException(f"commit of sync {sync_id}: {first_line(exc)[:200]}") from exc
                raise
            time.sleep(min(5.0, 0.1 * (2**attempt)) * random.uniform(0.5, 1.5))
    # The commit left ``table`` at the metadata it swapped in (pyiceberg's _do_commit): no reload needed to see it.
    found = find_sync_snapshot(table, sync_id)
    if found is None:
        raise SyncFailed(f"commit of sync {sync_id} reported success but its snapshot is not in the table")
    return found


def _expired_meanwhile(fresh: Table, expired: Sequence[int], sync_id: uuid.UUID) -> bool:
    """Whether a commit refused with a ValueError was refused because another writer expired snapshots this commit
    also expires: the SqlCatalog applies a commit's updates to the table as it is at commit time, and pyiceberg's
    snapshot removal refuses an id the table no longer has (``Snapshot with snapshot id … does not exist``), before
    any file is written or swapped in. Then nothing was committed, and the commit is retried as after a lost
    compare-and-swap (G4); any other ValueError propagates."""
    if not expired or find_sync_snapshot(fresh, sync_id) is not None:
        return False
    return not set(expired) <= {s.snapshot_id for s in fresh.snapshots()}


@contextlib.contextmanager
def _commit_failpoints(table: Table):
    """Fire 'commit-start' / 'in-commit' inside the catalog's commit call, around its compare-and-swap
    (only when one of them is armed: otherwise the catalog is left untouched)."""
    if not (is_armed("commit-start") or is_armed("in-commit")):
        yield
        return
    real = table.catalog

    class _Hooked:
        def __getattr__(self, name):
            return getattr(real, name)

        def commit_table(self, *args, **kwargs):
            failpoint("commit-start")
            response = real.commit_table(*args, **kwargs)
            failpoint("in-commit")
            return response

    table.catalog = _Hooked()  # type: ignore[assignment]  # duck-types the catalog: every other name passes through
    try:
        yield
    finally:
        table.catalog = real
