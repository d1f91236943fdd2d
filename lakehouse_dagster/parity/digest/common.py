"""What both sides share: the digest, its segments, the snapshot keys the writer sets, and the two ways a side is
digested (``full_digest`` per segment, ``plain_digest`` in one aggregate)."""

from __future__ import annotations

import dataclasses
import time

from pyiceberg.types import BooleanType, DateType, DoubleType, LongType, StringType, TimestamptzType

# Keys the mirror's writer puts into each snapshot summary and the table properties (lake/writer.py).
SYNC_ID = "lakehouse.sync-id"
SOURCE_VERSION = "lakehouse.source-version"
WRITE_PATH = "lakehouse.path"

EXPECTED_ICEBERG_TYPE = {
    "string": StringType(),
    "json": StringType(),
    "int64": LongType(),
    "float64": DoubleType(),
    "boolean": BooleanType(),
    "timestamp": TimestamptzType(),
    "date": DateType(),
}

Segments = dict[int, tuple[int, int]]


@dataclasses.dataclass(frozen=True)
class Digest:
    count: int
    sum: int
    seconds: float
    segments: Segments | None = None  # segment → (count, sum), for localisation (when asked for)
    lo: int = 0  # segment 0 starts here
    width: int = 0  # rows of __row_index space per segment

    @property
    def value(self) -> tuple[int, int]:
        return (self.count, self.sum)


def segment_plan(lo: int, hi: int, factor: int) -> int:
    """Width of ``factor`` equal segments covering [lo, hi)."""
    return max(1, -(-(hi - lo) // factor))


def fold(segments: Segments) -> tuple[int, int]:
    return sum(c for c, _ in segments.values()), sum(s for _, s in segments.values())


def full_digest(
    side, lo: int, hi: int, factor: int = 32, *, everything: bool = False, width: int | None = None
) -> Digest:
    """The side's digest over [lo, hi), kept per segment so a mismatch can start bisecting at once.
    ``everything``: the caller knows every row lies in [lo, hi) (from both sides' bounds); ``width``:
    fixed segments (the maintained digests' grid) instead of ``factor`` equal ones."""
    t = time.perf_counter()
    width = width or segment_plan(lo, hi, factor)
    segments = side.segment_digests(lo, hi, width, everything=everything)
    count, total = fold(segments)
    return Digest(count, total, time.perf_counter() - t, segments, lo, width)


def plain_digest(side) -> Digest:
    """The side's digest of every row, in one ungrouped aggregate (the canary's common path)."""
    t = time.perf_counter()
    count, total = side.digest()
    return Digest(count, total, time.perf_counter() - t)
