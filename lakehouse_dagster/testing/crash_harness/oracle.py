"""What must hold after every crash cycle (the package's docstring lists it)."""

from __future__ import annotations

from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.lake.writer import SYNC_FILE
from lakehouse_dagster.mirror.poller import Cursor, pending_syncs
from lakehouse_dagster.mirror.reaper import files_by_sync
from lakehouse_dagster.parity import canary
from lakehouse_dagster.parity.digest import IcebergSide, pin_iceberg
from lakehouse_dagster.testing.faults import (
    data_files_on_disk,
)
from lakehouse_dagster.tracking.datasets import parse_schema


class Oracle:
    """The checks, with a cache of each snapshot's data files (snapshots never change)."""

    def __init__(self, dsn: str, settings):
        self.dsn, self.settings = dsn, settings
        self.catalog = load_catalog(settings, dsn)
        self._files: dict[int, set[str]] = {}

    def _snapshot_files(self, table, snapshot_id: int) -> set[str]:
        if snapshot_id not in self._files:
            self._files[snapshot_id] = {
                t.file.file_path.rsplit("/", 1)[-1] for t in table.scan(snapshot_id=snapshot_id).plan_files()
            }
        return self._files[snapshot_id]

    def table(self, d):
        return load_table_or_none(self.catalog, table_identifier(self.settings, d))

    @staticmethod
    def _orphans_syncs(conn, names: list[str]) -> list[tuple]:
        """What the sync log says of the syncs the orphan files are named after (a violation's first clue: a plain
        `failed` row is never settled by the reaper, an `unsettled:` or `running` one should have been)."""
        ids = sorted({m.group(1) for m in map(SYNC_FILE.match, names) if m})
        rows = conn.execute(
            "select sync_id::text, status, left(coalesce(error, ''), 160) from iceberg_sync_log"
            " where sync_id::text = any(%s)",
            (ids,),
        ).fetchall()
        return [tuple(r) for r in rows] + [(sid, "no log row", "") for sid in ids if sid not in {r[0] for r in rows}]

    def before_clean_sync(self, conn, d) -> list[str]:
        bad = []
        table = self.table(d)
        snap = table.current_snapshot() if table is not None else None
        if snap is not None:
            missing = self._snapshot_files(table, snap.snapshot_id) - data_files_on_disk(table)
            if missing:
                bad.append(f"the current snapshot references missing files {sorted(missing)[:3]}")
        version = conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
        pin = pin_iceberg(self.catalog, self.settings, d)
        behind = pin.source_version is None or pin.source_version < version
        requested = d in {p.dataset_id for p in pending_syncs(conn, Cursor(), limit=1000)[0]}
        if behind and not requested:
            bad.append(
                f"Iceberg is behind (covers {pin.source_version}, Postgres at {version}) but the poller "
                "does not request the dataset"
            )
        return bad

    def after_clean_sync(self, conn, d) -> list[str]:  # noqa: C901
        """Long on purpose: one check per invariant after a clean sync, each with its message."""
        bad = []
        table = self.table(d)
        if table is None or table.current_snapshot() is None:
            return ["no table or no snapshot after a clean sync"]
        on_disk = data_files_on_disk(table)
        current = self._snapshot_files(table, table.current_snapshot().snapshot_id)
        referenced = set().union(*(self._snapshot_files(table, s.snapshot_id) for s in table.snapshots()))
        if current - on_disk:
            bad.append(f"the current snapshot references missing files {sorted(current - on_disk)[:3]}")
        if on_disk - referenced:
            orphans = sorted(on_disk - referenced)
            bad.append(
                f"{len(orphans)} orphan data files after the next sync, e.g. {orphans[:2]}; "
                f"their syncs' log rows: {self._orphans_syncs(conn, orphans)}"
            )
        named = {p.rsplit("/", 1)[-1] for paths in files_by_sync(table).values() for p in paths}
        unnamed = on_disk - named
        if unnamed:
            bad.append(f"data files not named after a sync: {sorted(unnamed)[:2]}")

        v = canary.evaluate(self.dsn, self.catalog, self.settings, d, localise=False)
        if v.verdict != canary.OK:
            bad.append(
                f"canary {v.verdict}: {v.detail.get('reason')} (pg {v.pg_count}/{v.pg_digest}, "
                f"iceberg {v.iceberg_count}/{v.iceberg_digest})"
            )
        pin = pin_iceberg(self.catalog, self.settings, d)
        columns = parse_schema(conn.execute("select schema from datasets where id = %s", (d,)).fetchone()[0])
        with IcebergSide(pin, columns, threads=1) as side:
            stats = side.identity_stats()
        if stats["rows"] != stats["distinct_row_index"]:
            bad.append(f"__row_index not unique: {stats['rows']} rows, {stats['distinct_row_index']} distinct")

        version, row_count, status = conn.execute(
            "select rows_version, row_count, status from datasets where id = %s", (d,)
        ).fetchone()
        pg_rows = conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0]
        if not (row_count == stats["rows"] == pg_rows):
            bad.append(
                f"row counts differ: datasets.row_count {row_count}, Iceberg {stats['rows']}, Postgres {pg_rows}"
            )
        if status != "ready":
            bad.append(f"dataset status {status!r} after a clean sync")
        log = conn.execute(
            "select sync_id, status, source_version, snapshot_id from iceberg_sync_log"
            " where dataset_id = %s order by finished_at",
            (d,),
        ).fetchall()
        snapshot_ids = {s.snapshot_id for s in table.snapshots()}
        for sid, st, sv, snap_id in log:
            if st == "running":
                bad.append(f"sync {sid} still 'running' after the next sync")
            if st == "succeeded":
                if snap_id not in snapshot_ids:
                    bad.append(f"succeeded sync {sid} names snapshot {snap_id}, not in the table")
                if sv is None or sv > version:
                    bad.append(f"succeeded sync {sid} covers version {sv}, Postgres is at {version}")
        latest = [r for r in log if r[1] == "succeeded"]
        if not latest or latest[-1][2] != version:
            bad.append(
                f"the latest succeeded sync covers {latest[-1][2] if latest else None}, Postgres is at {version}"
            )
        if d in {p.dataset_id for p in pending_syncs(conn, Cursor(), limit=1000)[0]}:
            bad.append("the poller still requests a caught-up dataset")
        return bad
