"""Digests of the files a write produces, from the rows in hand: what every writer of a table calls instead of
lake.writer.write_arrow, so the next canary reads those files' digests (parity/maintained.py) instead of the files.

Kept apart from maintained.py so that a writer pays for the digest machinery (numba's hash kernel, DuckDB) only
when LAKEHOUSE_DIGEST_ON_WRITE asks for it: importing maintained.py costs ~55 MB of a mirror's peak memory.
"""

from __future__ import annotations

import logging

from lakehouse_dagster.core.db import connection
from lakehouse_dagster.core.errors import first_line
from lakehouse_dagster.core.settings import PostgresSettings, Settings
from lakehouse_dagster.lake.writer import TableWrite, WriteResult, write_arrow
from lakehouse_dagster.tracking.datasets import Dataset

_log = logging.getLogger(__name__)


def write_digested(
    catalog, settings: Settings, dataset: Dataset, batches, plan: TableWrite, *, table=None, native_run=None
) -> WriteResult:
    """lake.writer.write_arrow (``plan``, ``table``, ``native_run`` as there), each written file digested from the
    rows in hand and the digests stored after the commit, when a DSN is configured and LAKEHOUSE_DIGEST_ON_WRITE
    holds."""
    digester = None
    if settings.postgres.dsn and settings.parity.digest_on_write:
        from lakehouse_dagster.parity.maintained import FileDigester  # lazy: numba + DuckDB only when asked for

        digester = FileDigester(dataset.columns)
    try:
        result = write_arrow(
            catalog, settings, dataset, batches, plan, table=table, digester=digester, native_run=native_run
        )
    finally:
        if digester is not None:
            digester.close()
    _store_written(settings.postgres, dataset, result.file_digests)
    return result


def _store_written(postgres: PostgresSettings, dataset: Dataset, digests: dict) -> None:
    """Best effort, after the commit: a file without a stored digest is digested by the next canary."""
    if not digests or not postgres.dsn:  # digests are made only when a DSN is configured (write_digested)
        return
    from lakehouse_dagster.parity.maintained import store_file_digests  # lazy: as above; digests exist only if asked

    try:
        with connection(postgres.dsn) as conn:
            store_file_digests(conn, dataset.id, dataset.columns, digests, "write")
    except Exception as exc:  # noqa: BLE001 - the data is committed; the digest is an optimisation
        _log.warning(
            "could not store the digests of %d file(s) of dataset %s: %s", len(digests), dataset.id, first_line(exc)
        )
