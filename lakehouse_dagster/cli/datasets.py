"""`lakehouse datasets`: what is there, with its workspace and mirror state (ids to paste into other commands)."""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, add_command, table


def register(sub) -> None:
    add_command(sub, "datasets", _list, help="list datasets with their workspace, Postgres version and last sync")


def _list(ctx, args) -> Result:
    from lakehouse_dagster.tracking import sync_log  # each verb imports what it uses

    rows = sync_log.datasets_with_last_sync(ctx.conn)
    from lakehouse_dagster.api.lifecycle import lifecycle_of  # each verb imports what it uses

    states = lifecycle_of(ctx.conn, [r[0] for r in rows]) if rows else {}
    data = [
        {
            "id": r[0],
            "name": r[1],
            "kind": r[2],
            "row_count": r[3],
            "status": r[4],
            "rows_version": r[5],
            "last_sync": r[6],
            "synced_version": r[7],
            "synced_at": r[8],
            "workspace": r[9],
            "workspace_id": r[10],
            "lifecycle": states[r[0]].describe() if r[0] in states else None,
        }
        for r in rows
    ]
    # One block per workspace, headed by its name and id (the --workspace of flags and flips).
    blocks: dict = {}
    for d in data:
        blocks.setdefault((d["workspace"], d["workspace_id"]), []).append(d)
    text = []
    for (ws_name, ws_id), items in blocks.items():
        head = f"workspace {ws_name} ({ws_id})" if ws_id is not None else "no workspace"
        text += [f"{head}: {len(items)} dataset(s)", _indent(table(items, COLUMNS)), ""]
    return Result(data, "\n".join(text) if text else "(no datasets)")


COLUMNS = ["id", "name", "kind", "lifecycle", "row_count", "status", "rows_version", "last_sync", "synced_version"]


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
