"""The forward mirror, the face the adapters import: a dataset's sync and its modes (mirror/sync.py, modes.py), many
datasets in one run (batch.py), the poller's tick (poller.py), the stream's shards, its loop and what it yields
(shards.py, stream.py, stream_lease.py, stream_reverse.py, stream_maintenance.py), and the orphan sweep (sweep.py).
The reverse mirror has its own face, api/reverse.py.

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.mirror.batch import Failed, mirror_many, run_sync_id
    from lakehouse_dagster.mirror.modes import MODES
    from lakehouse_dagster.mirror.poller import Cursor, Pending, Retry, backoff_seconds, plan_tick
    from lakehouse_dagster.mirror.shards import (
        STREAM_OFF,
        ShardPlan,
        StreamRun,
        down_count,
        plan_shards,
        shard_state,
        shard_views,
        shards_held,
    )
    from lakehouse_dagster.mirror.stream import Idle, Stopped, stream_shard
    from lakehouse_dagster.mirror.stream_lease import check_shard, shard_of
    from lakehouse_dagster.mirror.stream_maintenance import Maintained
    from lakehouse_dagster.mirror.stream_reverse import ReverseApplied, ReverseFailed
    from lakehouse_dagster.mirror.sweep import sweep
    from lakehouse_dagster.mirror.sync import SyncResult, peak_rss_mb, sync_dataset

_HOME = {
    "MODES": "lakehouse_dagster.mirror.modes",
    "SyncResult": "lakehouse_dagster.mirror.sync",
    "peak_rss_mb": "lakehouse_dagster.mirror.sync",
    "sync_dataset": "lakehouse_dagster.mirror.sync",
    "Failed": "lakehouse_dagster.mirror.batch",
    "mirror_many": "lakehouse_dagster.mirror.batch",
    "run_sync_id": "lakehouse_dagster.mirror.batch",
    "Cursor": "lakehouse_dagster.mirror.poller",
    "Pending": "lakehouse_dagster.mirror.poller",
    "Retry": "lakehouse_dagster.mirror.poller",
    "backoff_seconds": "lakehouse_dagster.mirror.poller",
    "plan_tick": "lakehouse_dagster.mirror.poller",
    "STREAM_OFF": "lakehouse_dagster.mirror.shards",
    "ShardPlan": "lakehouse_dagster.mirror.shards",
    "StreamRun": "lakehouse_dagster.mirror.shards",
    "down_count": "lakehouse_dagster.mirror.shards",
    "plan_shards": "lakehouse_dagster.mirror.shards",
    "shard_state": "lakehouse_dagster.mirror.shards",
    "shard_views": "lakehouse_dagster.mirror.shards",
    "shards_held": "lakehouse_dagster.mirror.shards",
    "Idle": "lakehouse_dagster.mirror.stream",
    "Stopped": "lakehouse_dagster.mirror.stream",
    "stream_shard": "lakehouse_dagster.mirror.stream",
    "check_shard": "lakehouse_dagster.mirror.stream_lease",
    "shard_of": "lakehouse_dagster.mirror.stream_lease",
    "ReverseApplied": "lakehouse_dagster.mirror.stream_reverse",
    "ReverseFailed": "lakehouse_dagster.mirror.stream_reverse",
    "Maintained": "lakehouse_dagster.mirror.stream_maintenance",
    "sweep": "lakehouse_dagster.mirror.sweep",
}

__all__ = [
    "Cursor",
    "Failed",
    "Idle",
    "MODES",
    "Maintained",
    "Pending",
    "Retry",
    "ReverseApplied",
    "ReverseFailed",
    "STREAM_OFF",
    "ShardPlan",
    "Stopped",
    "StreamRun",
    "SyncResult",
    "backoff_seconds",
    "check_shard",
    "down_count",
    "mirror_many",
    "peak_rss_mb",
    "plan_shards",
    "plan_tick",
    "run_sync_id",
    "shard_of",
    "shard_state",
    "shard_views",
    "shards_held",
    "stream_shard",
    "sweep",
    "sync_dataset",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
