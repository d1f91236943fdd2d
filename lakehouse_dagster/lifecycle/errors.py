"""Every exception of the lifecycle (issue 42, gathered by issue 45): a write or a verb the dataset's state refuses.

Both are operator refusals with exit 6 (the CLI) and 409 (the service), nothing written: ``WriteRefused`` when a
write aims at the store that is not the dataset's truth, ``LifecycleRefused`` (a ``FlipRefused``, so every caller
that catches a refused flip catches it) when a verb would move a dataset where the lifecycle does not go.
"""

from __future__ import annotations

from lakehouse_dagster.core.errors import FlipRefused, LakehouseError


class WriteRefused(LakehouseError):
    """A write aimed at the store that is not the dataset's truth; nothing was written. Not transient: the same
    write is refused again until an operator moves the writer or the dataset."""

    exit_code = 6
    transient = False


class LifecycleRefused(FlipRefused):
    """A verb would move a dataset where the lifecycle does not go (lifecycle/states.py); nothing was written."""


__all__ = ["LifecycleRefused", "WriteRefused"]
