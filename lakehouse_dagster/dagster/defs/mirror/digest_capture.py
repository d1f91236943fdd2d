"""The WAL consumer on a timer (tracking/capture/), so that in capture mode after-commit the slot never holds
much WAL back, and the change tracking never lags far, even when no reader catches it up. In capture mode
triggers a tick is one query."""

import dagster as dg

from lakehouse_dagster.api import capture
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.outage import skip_while_postgres_is_down


@dg.sensor(
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Capture mode after-commit: writes the change tracking and the maintained Postgres digest of "
    "the changes the replication slot holds, what `lakehouse digest-capture catch-up` does. Requests no runs.",
)
@skip_while_postgres_is_down
def digest_capture_consumer(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
    with lakehouse.connect() as conn:
        st = capture.state(conn)
        if not st.slot:
            return dg.SkipReason(
                f"capture mode {st.mode}: the digest is computed in the writing transaction; nothing to consume"
            )
        try:
            done = capture.catch_up(conn)
        except capture.CaptureError as exc:  # said plainly, not as a stack trace
            context.log.warning(str(exc))
            return dg.SkipReason(f"capture mode {st.mode}: cannot consume: {exc}")
    return dg.SkipReason(
        f"capture mode {st.mode}: decoded {done['transactions']} transaction(s), hashed {done['rows']} "
        f"row change(s) of registered datasets in {done['seconds']} s"
        + (f"; change tracking written for {done['tracked']} dataset(s)" if done.get("tracked") else "")
        + (f"; {done['dropped']} registration(s) dropped (the next canary refills them)" if done.get("dropped") else "")
    )
