"""Mismatch localisation: bisect ``__row_index`` ranges with range digests on both sides (as data-diff
does across databases) until the differing ranges are small, then compare their per-row hashes.

Each level splits a differing range into ``factor`` segments and asks both sides for per-segment
(count, sum) in one query each; only segments whose digests differ are descended into, in ascending
order, so the first ``limit`` differing row indexes are the lowest ones. A range with at most
``leaf_rows`` rows on either side is settled by comparing the multisets of (row_index, hash) pairs:
a changed, missing, extra or duplicated row shows up there by its index.
"""

from __future__ import annotations

import collections
import dataclasses
import time

from lakehouse_dagster.parity.digest import Segments, segment_plan

FACTOR = 32
LEAF_ROWS = 4096
LIMIT = 100


@dataclasses.dataclass
class Localisation:
    row_indexes: list[int]  # ascending, at most ``limit``
    truncated: bool  # more differing rows exist than were collected
    queries: int  # digest / leaf queries per side
    seconds: float


def localise(
    pg,
    ice,
    lo: int,
    hi: int,
    width: int | None = None,
    pg_segments: Segments | None = None,
    ice_segments: Segments | None = None,
    *,
    factor: int = FACTOR,
    leaf_rows: int = LEAF_ROWS,
    limit: int = LIMIT,
) -> Localisation:
    """Differing row indexes in [lo, hi) — every row of both sides lies in it — starting from both
    sides' segment digests of that range when the caller has them, else computing them first."""
    started = time.perf_counter()
    found: list[int] = []
    state = {"queries": 0, "truncated": False}
    if pg_segments is None or ice_segments is None or width is None:
        width = segment_plan(lo, hi, factor)
        state["queries"] += 1
        pg_segments = pg.segment_digests(lo, hi, width, everything=True)
        ice_segments = ice.segment_digests(lo, hi, width, everything=True)

    def leaf(a: int, b: int) -> None:
        state["queries"] += 1
        left = collections.Counter(pg.row_hashes(a, b))
        right = collections.Counter(ice.row_hashes(a, b))
        differing = sorted({ri for ri, _ in (left - right) + (right - left)})
        room = limit - len(found)
        if len(differing) > room:
            state["truncated"] = True
        found.extend(differing[:room])

    def visit(a: int, b: int, w: int, left: Segments, right: Segments) -> None:
        for seg in sorted(set(left) | set(right)):
            if left.get(seg) == right.get(seg):
                continue
            if len(found) >= limit:
                state["truncated"] = True
                return
            sa = a + seg * w
            sb = min(sa + w, b)
            rows = max(left.get(seg, (0, 0))[0], right.get(seg, (0, 0))[0])
            if rows <= leaf_rows or sb - sa <= 1:
                leaf(sa, sb)
            else:
                w2 = segment_plan(sa, sb, factor)
                state["queries"] += 1
                visit(sa, sb, w2, pg.segment_digests(sa, sb, w2), ice.segment_digests(sa, sb, w2))

    visit(lo, hi, width, pg_segments, ice_segments)
    return Localisation(found, bool(state["truncated"]), state["queries"], time.perf_counter() - started)
