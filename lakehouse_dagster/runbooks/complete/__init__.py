"""`lakehouse complete`: retire a native dataset's Postgres rows, the end of its writer migration (issue 31).

Refused, naming every missing condition at once with what to do, unless the dataset

  * has been written iceberg-native for at least the soak (flags/soak_setting.py; since when: the writers' flag
    audit replayed, flags/soak.py, as the widening rules read it);
  * has reverse parity ``ok``: the reverse mirror (mirror/reverse.py) is on and caught up (its position is the
    table's current snapshot), and the latest canary verdict is at that snapshot, agrees with Postgres (``ok``, or
    ``native`` with ``agrees_with_postgres``) and was taken at the dataset's current Postgres version;
  * has no Postgres-locked consumer left: not a pipeline input (the step-2b query's BLOCKED), no declared reader
    that reads it from Postgres (flags/reader_datasets.py ``on_postgres``: a reader locked to Postgres, or a compute
    reader — objects.sync, dashboards.aggregate, pipeline.expectations — whose mode for it is below iceberg; once
    flipped for it, after its shadow reads proved it, it holds nothing);
  * has no row holding a key its schema does not declare (tracking/undeclared.py): Iceberg and the export hold the
    declared columns only, so such a key would be deleted for good.

Then, in this order:

  1. **start** (one transaction, under the dataset lock G3, so no reverse apply or native write runs meanwhile):
     the reverse setting off at dataset scope (audited, note ``complete``), the reverse position dropped (dataset_rows
     will no longer hold that snapshot), its maintained Postgres digest unregistered (no batch hashes the rows it
     deletes; a canary fills it again after a restore), the durable mark ``lakehouse_completed`` (migration 034)
     ``in_progress``;
  2. **export** (``--export-to <dir>``): the rows as Parquet, typed as the table, identity columns included, streamed
     (memory bounded by one chunk of ``LAKEHOUSE_COMPLETE_BATCH_ROWS`` rows), before any row is deleted;
  3. **batches**: ``dataset_rows`` deleted by ``row_index`` ranges of the primary key, ``LAKEHOUSE_COMPLETE_BATCH_ROWS``
     rows per batch, each batch its own short transaction with a ``lock_timeout`` (a batch that would wait on the
     live app's row lock gives up and is retried after a pause; no table lock), the mark's cursor and count moved
     in the same transaction; each batch sets the reverse mirror's no-echo switch (``lakehouse.reverse_apply``,
     migration 033), so change tracking, the forward mirror and the recorder see no write of the live app;
  4. **finish**: in the batch that finds no row left, the mark becomes ``complete``.

Every step is in the append-only ``lakehouse_complete_audit`` (``lakehouse complete --status``). A crash or a kill
leaves the mark ``in_progress`` with its cursor: re-running ``complete`` continues from there (no check again: the
checks passed when it started, and the rows are partly gone). After complete, a writer rollback to pg is refused
(flags/gates.py, flags/completed.py) and the forward mirror refuses the dataset whatever its flags say.

The way back: ``lakehouse backfill --dataset <id>`` on a completed dataset (``restore``) turns the reverse
on for it again and re-syncs ``dataset_rows`` in full from the table's current snapshot (mirror/reverse.py's full
apply: identity preserved, one transaction, no echo), then marks it ``restored``; a rollback to pg then needs nothing
more (the rollback report says the dataset is reverse-synced). Plain Python over explicit arguments; no Dagster.

The package: ``checks.py`` (the conditions, the datasets of a scope), ``run.py`` (``complete``, ``complete_scope``:
start, batches, finish), ``export.py`` (``--export-to``), ``status.py`` (the audit, its owner, and
``complete_status``), ``restore.py`` (the way back). Callers import this face.
"""

from __future__ import annotations

from lakehouse_dagster.runbooks.complete.checks import NATIVE, PROVEN_NAMES, Checked, check, scope_datasets
from lakehouse_dagster.runbooks.complete.export import EXPORT_FILE_ROWS, EXPORT_PREFIX
from lakehouse_dagster.runbooks.complete.restore import (
    RestoreResult,
    backfill_or_restore,
    finish_restore,
    restore,
    start_restore,
)
from lakehouse_dagster.runbooks.complete.run import (
    LOCK_RETRIES,
    LOCK_TIMEOUT_MS,
    CompleteResult,
    CompleteScope,
    _delete_batches,
    _start,
    complete,
    complete_scope,
)
from lakehouse_dagster.runbooks.complete.status import complete_status

__all__ = [
    "EXPORT_FILE_ROWS",
    "EXPORT_PREFIX",
    "LOCK_RETRIES",
    "LOCK_TIMEOUT_MS",
    "NATIVE",
    "PROVEN_NAMES",
    "Checked",
    "CompleteResult",
    "CompleteScope",
    "RestoreResult",
    "_delete_batches",  # the lifecycle model drives one step at a time (testing/lifecycle_model.py)
    "_start",
    "backfill_or_restore",
    "check",
    "complete",
    "complete_scope",
    "complete_status",
    "finish_restore",
    "restore",
    "scope_datasets",
    "start_restore",
]
