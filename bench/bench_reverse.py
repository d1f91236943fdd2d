"""The reverse mirror's apply (mirror/reverse.py, issue 31), against a plain COPY measured in the same run.

    nice .venv/bin/python bench/bench_reverse.py [--rows 1000000] [--appends 20] [--append-rows 10] [--staged-too]

Set-up: a demo-shaped dataset of --rows rows (bench/_common.py) in Postgres, mirrored, read-flipped, canary ok,
its sync.full and sync.append writers set to iceberg_native (as the write router asks before a first native write),
the reverse on (the default) and applied once (the position: Postgres holds the mirrored snapshot).

  overwrite  a native sync.full of the same --rows rows (fresh identity, as a sync.full assigns it) through the write
             router and the chunked writer, then ``apply_reverse``: a full re-sync of --rows rows (timed: the apply
             alone, its phases from the apply's own log line)
  staged     with --staged-too: a second such overwrite applied through the staging path (the rows staged in a
             temporary table, the insert building their jsonb: the path before the client-built COPY)
  copy       the baseline: the same rows (dataset_id, row_index, row_id, created_at, data as jsonb) COPYed (binary,
             client side, from a file written beforehand) into dataset_rows for another dataset of the same schema,
             registered for the maintained digest as the first is, in one transaction with the no-echo switch set
             (the same triggers as the apply: digest on, change tracking off)
  append     --appends native sync.append commits of --append-rows rows on the --rows-row dataset, each followed by
             ``apply_reverse`` (timed: commit returned -> apply returned, i.e. rows in Postgres after the Iceberg
             commit, without the driver's poll): p50 / p95 / max, and how each was applied (append / full)

Prints one JSON line: the seconds of each, overwrite rows/s over copy rows/s (the issue's target ≥ 0.8) and the
append latency figures (target p50 ≤ 2 s). Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("LAKEHOUSE_SOAK_SECONDS", "0")  # the set-up flips at once (as the tests do)

from bench._common import BENCH_SCHEMA, admin_dsn, fresh_database, make_dataset, mirror_settings  # noqa: E402

WRITERS = ("sync.full", "sync.append")


class _Phases(logging.Handler):
    """The apply's own phase line (mirror/reverse.py logs it at debug level)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if " phases: " in record.getMessage():
            self.lines.append(record.getMessage())


def make_native(dsn: str, settings, catalog, rows: int) -> uuid.UUID:
    """The dataset, mirrored, read-flipped, canary ok, its writers native, the reverse applied once."""
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.flags.overrides import set_override
    from lakehouse_dagster.flags.registry import SERVABLE_READERS
    from lakehouse_dagster.mirror.reverse import apply_reverse
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary

    d, _ = make_dataset(dsn, rows)
    sync_dataset(dsn, catalog, settings, d, mode="full")
    with connect(dsn) as conn:
        for reader in SERVABLE_READERS:
            set_override(conn, "read", reader.name, "iceberg", dataset=d, actor="bench")
        verdicts = [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results]
        assert verdicts == ["ok"], verdicts
        for w in WRITERS:
            set_override(conn, "write", w, "iceberg_native", dataset=d, actor="bench")
    apply_reverse(dsn, catalog, settings, d, actor="bench")
    return d


def native_write(dsn: str, settings, catalog, d: uuid.UUID, writer: str, batches, max_row_index: int) -> int:
    """A native commit through the real write router and chunked writer (routing/native_table.py); its snapshot."""
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.flags.resolver import FlagResolver
    from lakehouse_dagster.lake.writer import TableWrite
    from lakehouse_dagster.routing.native_table import write_native_table
    from lakehouse_dagster.routing.write_router import route_write
    from lakehouse_dagster.tracking.datasets import get_dataset

    mode = "replace" if writer == "sync.full" else "append"
    with connect(dsn) as conn:
        dataset = get_dataset(conn, d)

        def iceberg_write(sync_id, version):
            plan = TableWrite(mode, sync_id, version, path="native", max_row_index=max_row_index)
            return write_native_table(catalog, settings, dataset, batches, plan, conn=conn)

        def pg_write():
            raise AssertionError("the pg path")

        out = route_write(
            conn,
            FlagResolver(conn, ttl_seconds=0),
            writer,
            d,
            pg_write=pg_write,
            iceberg_write=iceberg_write,
            settings=settings,
        )
    return out.value.snapshot_id


def _fresh(batch, shift: int | None, now):
    """The batch with fresh identity (new row ids, now as created_at; row_index from ``shift`` when given)."""
    import pyarrow as pa

    from lakehouse_dagster.sources.writers import uuid_texts

    if shift is not None:
        batch = batch.set_column(0, "__row_index", pa.array(range(shift, shift + batch.num_rows), pa.int64()))
    return batch.set_column(1, "__row_id", uuid_texts(batch.num_rows)).set_column(
        2, "__created_at", pa.array([now] * batch.num_rows, pa.timestamp("us", tz="UTC"))
    )


def overwrite(dsn: str, settings, catalog, d: uuid.UUID, rows: int) -> dict:
    from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
    from lakehouse_dagster.mirror.reverse import apply_reverse

    table = load_table_or_none(catalog, table_identifier(settings, d))
    now = dt.datetime.now(dt.UTC)
    source = table.scan().to_arrow()  # the table's rows, read before the rewrite replaces them
    native_write(
        dsn, settings, catalog, d, "sync.full", (_fresh(b, None, now) for b in source.to_batches(65_536)), rows - 1
    )
    del source
    phases = _Phases()
    log = logging.getLogger("lakehouse_dagster.mirror.reverse")
    log.addHandler(phases)
    log.setLevel(logging.DEBUG)
    t = time.perf_counter()
    r = apply_reverse(dsn, catalog, settings, d, actor="bench")
    seconds = time.perf_counter() - t
    log.removeHandler(phases)
    assert r.how == "full" and r.copied == rows and r.pg_rows == rows, r
    return {"seconds": seconds, "how": r.how, "removed": r.removed, "phases": phases.lines[-2:]}


def copy_baseline(dsn: str, d: uuid.UUID) -> dict:
    """The same rows COPYed (binary) into dataset_rows for another dataset registered for the digest."""
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.mirror.reverse import GUC
    from lakehouse_dagster.parity.maintained import ensure_pg
    from lakehouse_dagster.tracking import datasets

    path = Path(tempfile.mkdtemp(prefix="lh-bench-rev-")) / "rows.bin"
    with connect(dsn) as conn:
        ws = datasets.create_workspace(conn, "baseline")
        other = datasets.create_dataset(conn, ws, "baseline", BENCH_SCHEMA)
        found = conn.execute("select count(*) from lakehouse_pg_digest_state where dataset_id = %s", (d,)).fetchone()
        registered = bool(found and found[0])
        if registered:
            ensure_pg(conn, other, datasets.get_dataset(conn, other).columns)
        with (
            path.open("wb") as f,
            conn.cursor().copy(
                "copy (select %s::uuid, row_index, row_id, created_at, data from dataset_rows where dataset_id = %s)"
                " to stdout (format binary)",
                (other, d),
            ) as cp,
        ):
            for chunk in cp:
                f.write(chunk)
        t = time.perf_counter()
        with conn.transaction():
            conn.execute("select set_config(%s, 'on', true)", (GUC,))
            with (
                path.open("rb") as f,
                conn.cursor().copy(
                    "copy dataset_rows (dataset_id, row_index, row_id, created_at, data) from stdin (format binary)"
                ) as cp,
            ):
                while chunk := f.read(1 << 20):
                    cp.write(chunk)
        seconds = time.perf_counter() - t
        n = conn.execute("select count(*) from dataset_rows where dataset_id = %s", (other,)).fetchone()[0]
        conn.execute("vacuum analyze dataset_rows")  # the baseline's rows stay: another dataset's
    path.unlink()
    return {"seconds": seconds, "rows": n, "digest_registered": registered}


def appends(dsn: str, settings, catalog, d: uuid.UUID, rows: int, count: int, size: int) -> dict:
    import pyarrow as pa

    from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
    from lakehouse_dagster.mirror.reverse import apply_reverse

    table = load_table_or_none(catalog, table_identifier(settings, d))
    template = pa.Table.from_batches(list(table.scan(limit=size).to_arrow_batch_reader())).combine_chunks()
    template = template.to_batches()[0]
    lat, hows, base = [], [], rows
    phases = _Phases()
    log = logging.getLogger("lakehouse_dagster.mirror.reverse")
    log.addHandler(phases)
    log.setLevel(logging.DEBUG)
    for _ in range(count):
        batch = _fresh(template, base, dt.datetime.now(dt.UTC))
        native_write(dsn, settings, catalog, d, "sync.append", [batch], base + size - 1)
        t = time.perf_counter()
        r = apply_reverse(dsn, catalog, settings, d, actor="bench")
        lat.append(time.perf_counter() - t)
        hows.append(r.how)
        base += size
        assert r.pg_rows == base, r
    log.removeHandler(phases)
    split: dict[str, list[float]] = {}
    for line in phases.lines:
        for part in line.split("phases: ", 1)[1].split(", "):
            name, secs = part.rsplit(" ", 1)
            split.setdefault(name, []).append(float(secs.rstrip("s")))
    q = statistics.quantiles(lat, n=20)
    return {
        "phases_p50_s": {k: round(statistics.median(v), 3) for k, v in split.items()},
        "p50_s": round(statistics.median(lat), 3),
        "p95_s": round(q[18], 3),
        "max_s": round(max(lat), 3),
        "hows": {h: hows.count(h) for h in set(hows)},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--appends", type=int, default=20)
    ap.add_argument("--append-rows", type=int, default=10)
    ap.add_argument("--skip-overwrite", action="store_true")
    ap.add_argument(
        "--staged-too",
        action="store_true",
        help="a second overwrite applied through the staging path (the rows staged, the insert builds their jsonb)",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    dsn = fresh_database(admin_dsn(), "bench_reverse")
    settings, catalog = mirror_settings(dsn, "bench_reverse")
    t = time.perf_counter()
    d = make_native(dsn, settings, catalog, args.rows)
    out: dict = {"rows": args.rows, "setup_s": round(time.perf_counter() - t, 1)}
    if not args.skip_overwrite:
        ow = overwrite(dsn, settings, catalog, d, args.rows)
        staged = None
        if args.staged_too:
            import lakehouse_dagster.mirror.reverse as reverse
            from lakehouse_dagster.core.db import connect

            with connect(dsn) as conn:  # the first re-sync's dead rows gone, as they were before it
                conn.autocommit = True
                conn.execute("vacuum analyze dataset_rows")
            client = reverse.client_jsonb_supported
            reverse.client_jsonb_supported = lambda *a: False
            staged = overwrite(dsn, settings, catalog, d, args.rows)
            reverse.client_jsonb_supported = client
        cp = copy_baseline(dsn, d)
        out.update(
            {
                "overwrite_s": round(ow["seconds"], 2),
                "overwrite_phases": ow["phases"],
                "copy_s": round(cp["seconds"], 2),
                "copy_digest_registered": cp["digest_registered"],
                "overwrite_over_copy_rows_s": round(cp["seconds"] / ow["seconds"], 2),
            }
        )
        if staged is not None:
            out["staged_s"] = round(staged["seconds"], 2)
            out["staged_phases"] = staged["phases"]
            out["staged_over_copy_rows_s"] = round(cp["seconds"] / staged["seconds"], 2)
        print(json.dumps(out), flush=True)
    out["append"] = appends(dsn, settings, catalog, d, args.rows, args.appends, args.append_rows)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
