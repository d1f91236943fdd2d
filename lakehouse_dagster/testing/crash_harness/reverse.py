"""Reverse cycles (issue 31): native datasets of their own, a native change through the write router, then the
reverse apply killed or failed at its failpoints and the oracle of a whole snapshot in Postgres."""

from __future__ import annotations

import datetime as dt
import functools
import json
import random
import uuid

import pyarrow as pa

from lakehouse_dagster.flags import registry
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.lake.writer import MAX_ROW_INDEX, TableWrite
from lakehouse_dagster.mirror.poller import Cursor, pending_syncs
from lakehouse_dagster.mirror.reverse import apply_reverse, position
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity import canary
from lakehouse_dagster.routing.native_table import write_native_table
from lakehouse_dagster.routing.write_router import route_write
from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back
from lakehouse_dagster.runbooks.reverse_parity import reverse_parity
from lakehouse_dagster.status.recording import STREAMS, Position, read_stream
from lakehouse_dagster.testing.crash_harness.processes import (
    _infra_cycle,
    _infra_outcome,
    _reconnect,
    _reverse_popen,
    _run_script,
)
from lakehouse_dagster.testing.crash_harness.schedule import (
    INFRA_ACTIONS,
    NATIVE_SCHEMA,
    NATIVE_WRITERS,
    REVERSE_ACTIONS,
    REVERSE_ONCE,
    REVERSE_POINTS,
    STORE,
    STORE_ACTIONS,
    Report,
    _row,
    _value,
)
from lakehouse_dagster.testing.faults import (
    cli_env,
)
from lakehouse_dagster.tracking import datasets as app_tables


def make_native(conn, dsn, catalog, settings, ws, name: str, rng: random.Random) -> tuple[uuid.UUID, int]:
    """A dataset made ready the runbook's way (mirrored, every Iceberg-servable reader on iceberg, canary ok) and
    both its writers set to iceberg_native (overrides, ungated: the flip gates are not what is tested here), its
    reverse applied once (Postgres already holds every row). Returns it and the next row_index to append."""
    d = app_tables.create_dataset(conn, ws, name, NATIVE_SCHEMA)
    app_tables.insert_rows(conn, d, [_row(rng, NATIVE_SCHEMA) for _ in range(rng.randint(0, 200))])
    sync_dataset(dsn, catalog, settings, d, mode="full", readers=1)
    for r in registry.READERS.values():
        if registry.rank("read", r.ceiling) >= registry.rank("read", "iceberg"):
            set_override(conn, "read", r.name, "iceberg", dataset=d, note="crash harness", actor="crash-harness")
    verdicts = [v.verdict for v in run_canary_and_roll_back(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results]
    if verdicts != [canary.OK]:
        raise RuntimeError(f"the native dataset {d} is not ready: canary {verdicts}")
    for writer, _ in NATIVE_WRITERS:
        set_override(conn, "write", writer, "iceberg_native", dataset=d, note="crash harness", actor="crash-harness")
    apply_reverse(dsn, catalog, settings, d)
    table = load_table_or_none(catalog, table_identifier(settings, d))
    assert table is not None  # mirrored above
    return d, int(table.properties.get(MAX_ROW_INDEX, -1)) + 1


def _native_value(rng: random.Random, type_: str):
    v = _value(rng, type_)
    if type_ == "float64" and isinstance(v, str):
        return float(v)  # "NaN", "Infinity"
    if type_ == "json" and v is not None:
        return json.dumps(v, separators=(", ", ": "))
    return v


def native_change(conn, catalog, settings, d: uuid.UUID, native: dict, rng: random.Random, report: Report) -> str:
    """One native write of the dataset through the real write router and the native table writer: an append of
    1-300 rows after the table's last row_index, or an overwrite of the whole table (sync.full) with 1-300 new
    rows. Returns the writer."""
    writer = rng.choices([w for w, _ in NATIVE_WRITERS], weights=[w for _, w in NATIVE_WRITERS])[0]
    dataset = app_tables.get_dataset(conn, d)
    schema = arrow_schema(dataset.columns)
    n = rng.randint(1, 300)
    start = 0 if writer == "sync.full" else native[d]
    now = dt.datetime.now(dt.UTC)
    columns = {c.name: [_native_value(rng, c.type) for _ in range(n)] for c in dataset.columns}
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(range(start, start + n), pa.int64()),
            pa.array([str(uuid.uuid4()) for _ in range(n)]),
            pa.array([now] * n, pa.timestamp("us", tz="UTC")),
        ]
        + [pa.array(columns[c.name], schema.field(c.name).type) for c in dataset.columns],
        schema=schema,
    )
    mode = registry.get_flag("write", writer).iceberg_mode
    assert mode is not None  # both writers have a native mode

    def iceberg_write(sync_id, source_version):
        plan = TableWrite(mode, sync_id, source_version, path="native", max_row_index=start + n - 1)
        return write_native_table(catalog, settings, dataset, [batch], plan, conn=conn)

    def pg_write():
        raise RuntimeError(f"{writer} resolved to pg for the native dataset {d}")

    route_write(
        conn,
        FlagResolver(conn, ttl_seconds=0),
        writer,
        d,
        pg_write=pg_write,
        iceberg_write=iceberg_write,
        settings=settings,
        catalog=catalog,
    )
    native[d] = start + n
    report.ops["native-overwrite" if writer == "sync.full" else "native-append"] += 1
    return writer


def _tracking(conn, d) -> tuple:
    """What change tracking says of the dataset: a reverse apply moves none of it (no echo)."""
    return conn.execute(
        "select d.rows_version, d.rows_xid, d.rows_rewrite_version, d.mirrored_version,"
        " (select count(*) from lakehouse_row_changes c where c.dataset_id = d.id) from datasets d where d.id = %s",
        (d,),
    ).fetchone()


def _counts(conn, d) -> tuple[int, int]:
    return tuple(conn.execute("select row_count, max_row_index from datasets where id = %s", (d,)).fetchone())


def _pg_identity(conn, d) -> list[tuple]:
    return conn.execute(
        "select row_index, row_id::text, created_at from dataset_rows where dataset_id = %s order by row_index",
        (d,),
    ).fetchall()


def _table_identity(table, snapshot_id: int) -> list[tuple]:
    rows = (
        table.scan(snapshot_id=snapshot_id, selected_fields=("__row_index", "__row_id", "__created_at"))
        .to_arrow()
        .to_pylist()
    )
    return sorted((r["__row_index"], r["__row_id"], r["__created_at"]) for r in rows)


def reverse_cycle(  # noqa: C901
    conn, dsn, oracle, settings, d, native, rng, report, cycle, armed_share, actions=REVERSE_ACTIONS, infra=None
):
    """Long on purpose: one reverse crash cycle (arm, run, restart, check, in order). One reverse cycle of a native
    dataset; returns (the failpoint armed, the process's exit code, the harness's
    session: another one after a Postgres restart).

    A native change (an append, or an overwrite: a full reverse re-sync) lands in Iceberg; ``apply_reverse`` runs
    in its own process with a failpoint armed (or none) and is killed, terminated or failed there; Postgres must
    then hold a whole snapshot, the previous one when the failpoint was before the commit (the rows, the count and
    the position: nothing half-applied, a full re-sync's delete included) and the new one after it. One clean
    apply in this process follows, and must apply exactly when the killed one did not commit. Then the oracle:
    ``dataset_rows`` is the current snapshot (identity row by row, values by the canary's digests read the
    reverse's way: ``reverse_parity`` ok), the position and the one reverse reconciliation name it,
    ``datasets.row_count`` / ``max_row_index`` are the rows', and no echo: change tracking did not move, the
    forward poller does not request the dataset and the recorder sees no write. Given ``infra`` and an infrastructure
    fault drawn from ``actions``, the process is the operator's ``lakehouse reverse sync`` through the
    fault proxy, frozen at its failpoint while Postgres restarts or its connections are reset (or Postgres restarted
    at any moment of it, after which either snapshot may be whole): it must end with an exit the operator guide
    names and one line, as a sync must. Long on purpose: the checks read in the order the cycle runs."""
    where = f"cycle {cycle} (native dataset {d}"
    try:
        writer = native_change(conn, oracle.catalog, settings, d, native, rng, report)
    except Exception as exc:  # noqa: BLE001 - a violation, reported with the cycle
        report.violations.append(f"{where}): the native write failed: {type(exc).__name__}: {exc}")
        return None, 0, conn
    table = oracle.table(d)
    current = table.current_snapshot().snapshot_id
    before = position(conn, d)
    prev = None if before is None else before.snapshot_id
    tracked = _tracking(conn, d)
    counted = _counts(conn, d)  # the native write's (the table's row count): only a committed apply moves them
    xid = int(conn.execute("select pg_current_xact_id()::text::bigint").fetchone()[0])
    spec = point = action = None
    if rng.random() < armed_share:
        point = rng.choice(REVERSE_POINTS)
        action = rng.choices([a for a, _ in actions], weights=[w for _, w in actions])[0]
        spec = (
            "reverse-anytime:pg-restart"
            if action == "anytime-pg-restart"
            else f"reverse-whole:{action}"
            if action in STORE
            else f"{point}:{action}"
        )
        report.armed[spec] += 1
    if infra is not None and spec is not None and action in {a for a, _ in INFRA_ACTIONS + STORE_ACTIONS}:
        env = cli_env(None, LAKEHOUSE_PG_DSN=infra.proxy.dsn(dsn), LAKEHOUSE_SNAPSHOTS_KEEP="0")
        rc, stderr, fired = _infra_cycle(
            infra,
            spec.removeprefix("reverse-") if spec.startswith(("reverse-anytime", "reverse-whole")) else spec,
            functools.partial(_reverse_popen, d),
            env,
            rng,
            window=(0.3, 2.0),  # ~1 s of imports, then the apply: some land before, most during
        )
        conn = _reconnect(conn, dsn)
        report.outcomes[rc] += 1
        report.ops["reverse"] += 1
        where = f"{where}, {writer}, reverse, failpoint {spec}, exit {rc})"
        if fired:
            report.fired[spec] += 1
        report.violations += [f"{where}: {v}" for v in _infra_outcome(rc, stderr, fired)]
    else:
        env = cli_env(spec, LAKEHOUSE_PG_DSN=dsn, LAKEHOUSE_SNAPSHOTS_KEEP="0")
        rc, stderr = _run_script(REVERSE_ONCE, str(d), env, report, "reverse")
        where = f"{where}, {writer}, reverse, failpoint {spec}, exit {rc})"
        fired = bool(spec) and (rc in (-9, -15) or "failpoint" in stderr)
        if fired:
            report.fired[spec] += 1
        elif rc != 0:
            report.violations.append(f"{where}: a reverse apply without a fired failpoint exited {rc}: {stderr[-300:]}")

    # right after the process: a whole snapshot, the previous one unless the process got past its commit (either,
    # when Postgres restarted at some moment of it: its commit may or may not have landed)
    at = position(conn, d)
    held = None if at is None else at.snapshot_id
    should_commit = not fired or point == "reverse-after-commit"
    if spec == "reverse-whole:store-down":  # nothing of the table could be read: nothing was written
        allowed = {prev}
    elif fired and spec in ("reverse-anytime:pg-restart", "reverse-whole:store-flaky"):  # its commit may have landed
        allowed = {prev, current}
    else:
        allowed = {current if should_commit else prev}
    if held not in allowed:
        report.violations.append(
            f"{where}: the position is {held} after the process; the previous snapshot is {prev}, the current {current}"
        )
    if held is not None:
        identity = _table_identity(table, held)
        if _pg_identity(conn, d) != identity:
            report.violations.append(f"{where}: dataset_rows is not snapshot {held} (the position) after the process")
        counts = _counts(conn, d)
        whole = (len(identity), identity[-1][0] if identity else -1) if held == current else counted
        if counts != whole:
            report.violations.append(
                f"{where}: datasets.row_count/max_row_index {counts} after the process, not {whole} (position {held})"
            )

    # the clean apply: it applies exactly when the process did not commit (no snapshot applied twice)
    try:
        result = apply_reverse(dsn, oracle.catalog, settings, d)
    except Exception as exc:  # noqa: BLE001 - a violation, reported with the cycle
        report.violations.append(f"{where}: the clean reverse apply failed: {type(exc).__name__}: {exc}")
        return spec, rc, conn
    committed = held == current
    if committed and result.how != "noop":
        report.violations.append(f"{where}: snapshot {current} applied twice (the clean apply did {result.how})")
    if not committed and result.how == "noop":
        report.violations.append(f"{where}: the clean apply did nothing, the position was {held} ({result.reason})")
    report.ops[f"reverse-{result.how if not committed else 'noop'}"] += 1
    report.violations += [f"{where}: {v}" for v in _reverse_oracle(conn, dsn, oracle, settings, d, current, xid)]
    if _tracking(conn, d) != tracked:
        report.violations.append(f"{where}: an echo: change tracking moved ({tracked} → {_tracking(conn, d)})")
    return spec, rc, conn


def _reverse_oracle(conn, dsn, oracle, settings, d, current: int, xid: int) -> list[str]:
    """After the clean apply: Postgres is the current snapshot, recorded once, without echo."""
    bad = []
    table = oracle.table(d)
    if table.current_snapshot().snapshot_id != current:
        bad.append(f"the table moved during the cycle ({current} → {table.current_snapshot().snapshot_id})")
    at = position(conn, d)
    if at is None or at.snapshot_id != current:
        bad.append(f"the position is {None if at is None else at.snapshot_id}, the current snapshot {current}")
    reconciled = conn.execute(
        "select snapshot_id from lakehouse_pg_reconciled where dataset_id = %s and how = 'reverse'", (d,)
    ).fetchall()
    if reconciled != [(current,)]:
        bad.append(f"reverse reconciliations {reconciled}, not one of snapshot {current}")
    identity = _table_identity(table, current)
    if _pg_identity(conn, d) != identity:
        bad.append(f"dataset_rows' identity is not snapshot {current}'s ({len(identity)} rows)")
    v = reverse_parity(dsn, oracle.catalog, settings, d)
    if v is None or v.verdict != canary.OK:
        bad.append(f"reverse parity {None if v is None else v.verdict}: {None if v is None else v.detail}")
    row_count, max_row_index = conn.execute(
        "select row_count, max_row_index from datasets where id = %s", (d,)
    ).fetchone()
    pg = conn.execute(
        "select count(*), coalesce(max(row_index), -1) from dataset_rows where dataset_id = %s", (d,)
    ).fetchone()
    if (row_count, max_row_index) != tuple(pg) or row_count != len(identity):
        bad.append(
            f"datasets.row_count/max_row_index {row_count}/{max_row_index}, dataset_rows {pg[0]}/{pg[1]}, "
            f"snapshot {len(identity)} rows"
        )
    pending, _, _ = pending_syncs(conn, Cursor(xid + 1), limit=1000, exclude_native=False)
    if d in {p.dataset_id for p in pending}:
        bad.append("an echo: the forward poller requests the dataset after the reverse apply")
    for stream in STREAMS:
        changes, _ = read_stream(conn, stream, Position(xid + 1), 100)
        if changes:
            bad.append(f"an echo: the recorder's {stream} stream sees {len(changes)} change(s), e.g. {changes[0]}")
    return bad
