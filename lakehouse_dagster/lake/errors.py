"""Every exception of the lake (issue 45): a table move refused, a value the client-side copy back cannot write.

``CopyRefused`` reaches an operator (a LakehouseError: `lakehouse catalog migrate` exits 2 with its line);
``ClientJsonbUnsupported`` never leaves the reverse mirror, which takes the staging path instead.
"""

from __future__ import annotations

from lakehouse_dagster.core.errors import LakehouseError


class CopyRefused(LakehouseError):
    """A table this run cannot move as it is (diverged, or a catalog that does not do what it was asked): nothing of
    it was changed in the target, the message says what to do."""


class ClientJsonbUnsupported(Exception):
    """A value the client cannot write exactly as the pg path's jsonb expression does (lake/copy_back.py): the
    caller takes the staging path (``data_expr``) instead."""


__all__ = ["ClientJsonbUnsupported", "CopyRefused"]
