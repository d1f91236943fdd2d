"""Tables an operator reads in the UI: a ``TableMetadataValue`` (sortable, typed columns, shown in the metadata
panel as a table) and the same rows as one log line each (the run's log, searchable, and what a console shows),
never markdown hidden behind a button. Built in one place so every job's tables read alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

# (column name, Dagster type name: string | int | float | bool)
Columns = Sequence[tuple[str, str]]


def _cell(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "bool" and isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)):
        return "; ".join(str(v) for v in value)
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Columns) -> dg.TableMetadataValue:
    """The rows as a typed metadata table (only ``columns``, in that order)."""
    schema = dg.TableSchema(columns=[dg.TableColumn(name=name, type=kind) for name, kind in columns])
    records = [dg.TableRecord({name: _cell(r.get(name), kind) for name, kind in columns}) for r in rows]
    return dg.MetadataValue.table(records, schema=schema)


def log_rows(context, title: str, rows: Sequence[Mapping[str, Any]], columns: Columns, *, warn=None) -> None:
    """One log line per row: ``<title>: col=value, ...`` (``warn(row)`` True: at warning level)."""
    for r in rows:
        text = f"{title}: " + ", ".join(f"{name}={_cell(r.get(name), kind)}" for name, kind in columns)
        (context.log.warning if warn is not None and warn(r) else context.log.info)(text)


def logged_table(
    context, title: str, rows: Sequence[Mapping[str, Any]], columns: Columns, **kw
) -> dg.TableMetadataValue:
    """Both: the log lines now, the table to attach as metadata."""
    log_rows(context, title, rows, columns, **kw)
    return table(rows, columns)
