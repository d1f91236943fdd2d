"""Every exception of the parity capability, in one place (issue 45): each says why a digest cannot answer.

Two of them are not failures but a turn onto the slower path: the canary and the health check catch them and read
every row instead. ``DigestUnavailable`` is the one that reaches an operator (a LakehouseError: the CLI's exit 5, a
Dagster step's failure); the others never leave the package.
"""

from __future__ import annotations

from lakehouse_dagster.core.errors import LakehouseError


class DigestUnavailable(LakehouseError):
    """A side's digest could not be computed (the message says which side and why)."""

    exit_code = 5


class MaintainedDigestUnavailable(Exception):
    """No maintained digest for this side right now (the message says why): use the full digest."""


class FileFactsUnavailable(Exception):
    """The per-file facts cannot answer for this snapshot (the message says why): read every row."""


__all__ = ["DigestUnavailable", "FileFactsUnavailable", "MaintainedDigestUnavailable"]
