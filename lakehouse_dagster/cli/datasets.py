"""`lakehouse datasets`: what is there, with its mirror state (ids to paste into other commands)."""

from __future__ import annotations

from .common import Result, add_command, table


def register(sub) -> None:
    add_command(sub, "datasets", _list, help="list datasets with their Postgres version and last sync")


def _list(ctx, args) -> Result:
    rows = ctx.conn.execute(
        """
        select d.id, d.name, d.kind, d.row_count, d.status, d.rows_version, l.status, l.source_version, l.finished_at
          from datasets d
          left join lateral (select status, source_version, finished_at from iceberg_sync_log s
                              where s.dataset_id = d.id order by s.started_at desc limit 1) l on true
         order by d.name, d.id
        """
    ).fetchall()
    data = [
        {"id": r[0], "name": r[1], "kind": r[2], "row_count": r[3], "status": r[4], "rows_version": r[5],
         "last_sync": r[6], "synced_version": r[7], "synced_at": r[8]}
        for r in rows
    ]
    text = table(data, ["id", "name", "kind", "row_count", "status", "rows_version", "last_sync", "synced_version"])
    return Result(data, text)
