"""Every exception of routing's own (issue 45). A read nothing can serve stays core's ``ReadRefused``, beside
``FlipRefused`` (both exit 6 and 409); what only the structured reads' Iceberg executor refuses is here.
"""

from __future__ import annotations

from lakehouse_dagster.core.errors import LakehouseError


class CannotServe(LakehouseError):
    """The Iceberg executor cannot answer this read exactly (the reason says why); nothing was read."""

    exit_code = 2
    http_status = 400


__all__ = ["CannotServe"]
