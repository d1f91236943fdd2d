"""Every exception of the sources (issue 45): a source that cannot be read, a value that does not fit its column.

``BadValue`` never leaves the package: the readers catch it and raise ``SourceError`` naming the file and row (or
table, row and cursor), never the value. ``SourceError`` is a ``SyncFailed``: exit 4, nothing committed.
"""

from __future__ import annotations

from lakehouse_dagster.core.errors import SyncFailed


class SourceError(SyncFailed):
    """A source that cannot be read, or a value in it that does not fit — located (file + row, or table + row
    and cursor), never showing the value."""


class BadValue(ValueError):
    """A value that does not fit its column: where it is and what kind of value it was."""

    def __init__(self, index: int, column: str, expected: str, got: str):
        super().__init__(f"row {index} column {column}: expected {expected}, got {got}")
        self.index, self.column, self.expected, self.got = index, column, expected, got


__all__ = ["BadValue", "SourceError"]
