"""Migrations of the ingest area.

``ROW_CHANGES`` — migration "019_row_changes": which ``row_index`` ranges a rewriting statement touched,
so that a sync after a small ``row.edit`` rewrites only the Iceberg data files holding them
(tracking/row_changes.py, the "partial" sync mode).

A statement on ``dataset_rows`` that is not a pure append above ``max_row_index`` (an UPDATE, a DELETE,
an INSERT at or below the max) already moves ``datasets.rows_rewrite_version`` to its version ``v``.
It now also writes, in the same statement trigger and from the transition tables it already scans, one
row per (dataset, 4096-wide bucket of row_index) into ``lakehouse_row_changes``: the [min, max] it
touched in that bucket (an UPDATE counts old and new row_index), and ``prev_version``: the dataset's
``rows_rewrite_version`` before this statement. The records of a dataset therefore form a chain
``rows_rewrite_version → prev_version → …``; a sync follows it from the head down to the version it
mirrored, and any missing link (a TRUNCATE, a schema change, writes from before this migration or from a
session still running the old trigger body) means "unknown" and the sync goes full, as before.
Pruned by the sync once mirrored (records at or below the mirrored version are never read again).

The records are written by the change-tracking functions of migration "020_app_write_cost"
(schema/migrate.py ONE_DATASET_TRACKING, the blocks marked ``-- 019: row ranges``, placed after the row
locks and the version draw and before the UPDATE of ``datasets``, so the previous ``rows_rewrite_version``
is still in hand). Statements committed between this migration and 020 record nothing: their chain has
a missing link and the next sync goes full, which is safe.
"""

ROW_CHANGES = """
create table if not exists lakehouse_row_changes (
  dataset_id uuid not null,
  version bigint not null,          -- the statement's rows_version (= its rows_rewrite_version)
  bucket bigint not null,           -- row_index >> 12
  prev_version bigint not null,     -- the dataset's rows_rewrite_version before the statement
  min_idx bigint not null,
  max_idx bigint not null,
  primary key (dataset_id, version, bucket)
);
"""
