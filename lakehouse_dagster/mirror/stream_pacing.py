"""How a stream (mirror/stream.py) paces one dataset's work: a busy dataset tried again after a doubling pause, and a
dataset's syncs (or reverse applies) kept to their share of the time.
"""

from __future__ import annotations

import uuid

BUSY_RETRY_S = 0.5  # a dataset another sync holds (or past the G2 bound) is tried again after this, doubling to 8 s


class _Rest:
    """A dataset's syncs take at most ``share`` of the time (settings.stream.sync_share): after a sync of T seconds,
    its next one waits T × (1/share − 1). Cheap syncs are hardly delayed; a dataset written without pause whose
    syncs are heavy is synced at a batch run's pace instead of back to back, leaving the CPU to the live app."""

    def __init__(self, share: float):
        self._factor = 1.0 / share - 1.0
        self._until: dict[uuid.UUID, float] = {}

    def synced(self, ds: uuid.UUID, seconds: float, now: float) -> float:
        """Note a sync of ``seconds`` that landed at ``now``; when the dataset's next sync may start."""
        if self._factor <= 0:
            return now
        self._until[ds] = now + seconds * self._factor
        return self._until[ds]

    def due_at(self, ds: uuid.UUID, at: float) -> float:
        until = self._until.get(ds)
        if until is None:
            return at
        if until <= at:  # rested already: forgotten, so the map holds only the datasets resting now
            del self._until[ds]
            return at
        return until
