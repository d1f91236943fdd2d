"""POST /lakehouse/fallback: a fallback an app's own router took (the runbooks' app keeps
``lib/lakehouse/read-router.ts`` and asks GET /lakehouse/route), recorded exactly as the in-process read router
records its own: the same row (flags/incidents.py: what restarts a soak, the rollout analysis counts, the recorder
puts on the partition page, the overview lists), the same ``[read-router]`` log line, the same counter.

Checked before anything is written (service/bodies.py, then here): a reader that can read Iceberg, a dataset that
exists and has a table. A refusal writes nothing.
"""

from __future__ import annotations

import logging

from lakehouse_dagster.api.datasets import get_dataset
from lakehouse_dagster.api.flags import READ, insert_fallback
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.service.bodies import FallbackRequest
from lakehouse_dagster.service.db import ServiceDb


def record_reported_fallback(db: ServiceDb, req: FallbackRequest, router_log: logging.Logger) -> dict:
    """Record one reported fallback; the answer says what was recorded and the reader's mode now."""
    with db.connection() as conn:
        dataset = get_dataset(conn, req.dataset_id)  # 404 for a dataset that does not exist
        if dataset.kind != "tabular":
            raise BadInput(
                f"dataset {dataset.name} ({dataset.id}) is a {dataset.kind} dataset: it has no Iceberg table, so no "
                "read of it can fall back; nothing recorded"
            )
        mode = db.resolver().resolve(READ, req.reader, dataset.id).mode
        fallback_id, at = insert_fallback(conn, req.reader, dataset.id, req.reason)
    router_log.warning(
        f"[read-router] {req.reader} ds={dataset.id} iceberg read failed → PG fallback: {req.reason[:300]}"
        " (reported by the app)"
    )
    return {
        "recorded": True,
        "fallback_id": fallback_id,
        "at": at.isoformat(),
        "reader": req.reader,
        "dataset_id": str(dataset.id),
        "dataset_name": dataset.name,
        "mode": mode,
    }
