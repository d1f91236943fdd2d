"""A canary's verdict on one dataset as it is being decided (parity/canary.py), and the test seams between its two pins."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

from lakehouse_dagster.parity.verdicts import (  # names canary.py uses; DEFAULT_LIMIT etc. re-exported below
    MISMATCH,
    OK,
)


@dataclasses.dataclass
class Verdict:
    dataset_id: uuid.UUID
    dataset: str
    verdict: str
    pg_count: int | None = None
    iceberg_count: int | None = None
    pg_digest: int | None = None
    iceberg_digest: int | None = None
    snapshot_id: int | None = None
    pg_version: int | None = None
    iceberg_version: int | None = None
    smoke: str | None = None
    mismatched_row_indexes: list[int] = dataclasses.field(default_factory=list)
    detail: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    wedged: bool = False

    @property
    def caught_up(self) -> bool:
        return self.verdict in (OK, MISMATCH)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["dataset_id"] = str(self.dataset_id)
        # digests are exact integers wider than a JSON double: keep them as decimal strings
        for k in ("pg_digest", "iceberg_digest"):
            d[k] = None if d[k] is None else str(d[k])
        return d

    def summary_line(self) -> str:
        """One line for people: verdict and the reason."""
        reason = self.detail.get("reason", "")
        return f"{self.verdict}: {reason}" if reason else self.verdict


@dataclasses.dataclass
class Hooks:
    """Test seams (real code paths, no mocks): run between the two pins."""

    after_iceberg_pin: Callable[[], None] | None = None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
