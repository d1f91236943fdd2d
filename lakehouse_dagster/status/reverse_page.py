"""What a native dataset's ``postgres/dataset_rows`` partition page says of its reverse mirror, so the page never shows
an old copy as if it were current.

Each reverse apply is a materialization of that partition naming the snapshot it applied (the stream's or the
``reverse_mirror_job``'s). When the reverse then falls behind — its driver down, an apply failing — nothing would
say so there: the newest event would still read "snapshot P applied". So the recorder (dagster/defs/recording/)
asks here each tick, from Postgres alone (``mirror/reverse_lag.py``: the overview's, ``/metrics``' and the
``reverse_behind`` alert's one definition), which datasets are behind longer than ``LAKEHOUSE_REVERSE_LAG_PAGE_SECONDS``
and records one observation when such an episode starts (and again if an apply moves the copy on while it is still
behind), and one when it ends: caught up, reverse turned off, or no longer written iceberg-native. The reported
episodes live in the recorder's cursor, so a quiet dataset costs no event, and the stream's sub-second lag never
shows.
"""

from __future__ import annotations

import dataclasses
import uuid

import psycopg

from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.mirror.reverse_lag import ReverseLag, reverse_lags


@dataclasses.dataclass(frozen=True)
class ReversePageChange:
    dataset_id: uuid.UUID
    behind: bool  # True: an episode starts (or moved on while still behind); False: the one shown ended
    lag: ReverseLag | None  # the reverse as it is now (None: the reverse no longer runs for the dataset)
    ended_because: str = ""  # behind False: why the page may stop saying it is behind

    def description(self) -> str:
        if self.behind:
            assert self.lag is not None
            return f"dataset_rows is behind Iceberg: {self.lag.describe()}"
        return f"dataset_rows no longer behind Iceberg: {self.ended_because}"


def reverse_page_changes(
    conn: psycopg.Connection, shown: dict[uuid.UUID, int | None], bound_seconds: float
) -> tuple[list[ReversePageChange], dict[uuid.UUID, int | None]]:
    """(the changes the pages must show, the episodes shown after them: {dataset: the snapshot the copy held when its
    page last said it was behind}). Three queries whatever the number of datasets."""
    native = native_dataset_ids(conn)
    lags, _off = reverse_lags(conn, native)
    changes: list[ReversePageChange] = []
    now: dict[uuid.UUID, int | None] = {}
    for d, behind in sorted(lags.items()):
        if behind.caught_up or (behind.lag_seconds or 0.0) < bound_seconds:
            continue
        now[d] = behind.applied_snapshot
        if d not in shown or shown[d] != behind.applied_snapshot:
            changes.append(ReversePageChange(d, True, behind))
    for d in sorted(set(shown) - set(now)):
        lag = lags.get(d)
        if d not in native:
            why = "the dataset is no longer written iceberg-native (Postgres is its truth again)"
        elif lag is None:
            why = "its reverse mirror was turned off: nothing keeps dataset_rows now (lakehouse reverse status)"
        elif lag.caught_up:
            why = f"caught up: it holds snapshot {lag.applied_snapshot}, the table's newest native commit"
        else:
            why = f"within {bound_seconds:.0f} s of Iceberg again: {lag.describe()}"
        changes.append(ReversePageChange(d, False, lag, why))
    return changes, now
