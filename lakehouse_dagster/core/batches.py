"""Cutting a list of work into runs: one definition for the mirror poller's batches and the canary schedule's."""

from __future__ import annotations

from collections.abc import Sequence


def split_near_equal(items: Sequence, size: int) -> list[list]:
    """``ceil(len / size)`` contiguous batches of near-equal length, none above ``size`` (30 by 25: 15 + 15, not
    25 + 5; 2,500 by 1,000: 834 + 833 + 833), so the runs of one tick finish together."""
    if not items:
        return []
    n = -(-len(items) // size)
    base, extra = divmod(len(items), n)
    out, i = [], 0
    for k in range(n):
        step = base + (1 if k < extra else 0)
        out.append(list(items[i : i + step]))
        i += step
    return out
