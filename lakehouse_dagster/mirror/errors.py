"""Every exception of the mirror's own (issue 45). A failed sync is core's ``SyncFailed`` family (every layer
raises it); what only the reverse mirror refuses is here.
"""

from __future__ import annotations

from lakehouse_dagster.core.errors import LakehouseError


class PostgresWritten(LakehouseError):
    """Something other than the reverse mirror wrote a native dataset's dataset_rows since the last apply: those rows
    are not in Iceberg (the truth), and an apply could only re-sync them away. Refused, nothing written; not
    transient — an operator decides (see the message)."""

    exit_code = 6
    transient = False


__all__ = ["PostgresWritten"]
