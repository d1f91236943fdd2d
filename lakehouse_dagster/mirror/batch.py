"""Mirror many datasets in one process (one Dagster run for many changed datasets: the process start-up, the
imports and the catalog are paid once, not per dataset).

Datasets are synced one at a time, each through ``sync_dataset`` (its own G3 lock, G2 slot, sync log row), so a
batch never holds one dataset's lock while waiting for another's. A dataset whose lock another sync holds, or that
meets backpressure or a transient failure, is put aside and tried again after the others (same sync id, so a
commit that landed is found, not repeated); a dataset that fails for good is reported and never stops the rest.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

from lakehouse_dagster.core.db import IdlePool
from lakehouse_dagster.core.errors import Backpressure, LakehouseError, is_transient
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.mirror.sync import SyncResult, sync_dataset

# While others wait in the batch, a dataset another sync is writing is skipped after this long, not waited for.
BUSY_LOCK_WAIT_S = 0.2


def run_sync_id(run_id: str, dataset_id: uuid.UUID | str) -> uuid.UUID:
    """One sync id per (run, dataset): a retried step or pass finds its own snapshot instead of appending twice."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"lakehouse:{run_id}:{dataset_id}")


@dataclasses.dataclass(frozen=True)
class Failed:
    dataset_id: uuid.UUID
    error: LakehouseError


def mirror_many(
    dsn: str,
    catalog,
    settings,
    dataset_ids: Iterable[uuid.UUID | str],
    *,
    run_id: str,
    mode: str = "auto",
    passes: int = 4,
    backoff_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[SyncResult | Failed]:
    """Sync each dataset, yielding its SyncResult as it lands, or Failed once it failed for good. The ones a retry
    may help (busy lock, backpressure, transient error) are tried again after the rest, up to ``passes`` passes
    with a doubling backoff between them; the last pass waits for a busy lock as a single sync would.
    Interruptions propagate (each sync records what is true; datasets not reached stay behind Postgres for the
    poller's sweep)."""
    pending = list(dict.fromkeys(parse_uuid(d, "dataset id") for d in dataset_ids))
    with IdlePool() as pool:  # the pinned read's and the readers' connections, reused from one dataset to the next
        for n in range(1, passes + 1):
            last = n == passes
            again: list[uuid.UUID] = []
            for ds_id in pending:
                try:
                    r = sync_dataset(
                        dsn,
                        catalog,
                        settings,
                        ds_id,
                        mode=mode,
                        sync_id=run_sync_id(run_id, ds_id),
                        run_id=run_id,
                        lock_timeout_s=1800 if last else BUSY_LOCK_WAIT_S,
                        pool=pool,
                    )
                except LakehouseError as exc:
                    if not last and (isinstance(exc, Backpressure) or is_transient(exc)):
                        again.append(ds_id)
                    else:
                        yield Failed(ds_id, exc)
                else:
                    yield r
            if not again:
                return
            pending = again
            sleep(backoff_s * 2 ** (n - 1))
