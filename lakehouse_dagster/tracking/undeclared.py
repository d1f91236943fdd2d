"""Keys of ``dataset_rows.data`` that ``datasets.schema`` does not declare (issue 42, item 5).

Iceberg holds only the declared columns, so such a key has no place in the table: mirrored, it would vanish;
re-synced back from Iceberg or completed, it would be erased from Postgres. The project refuses instead
(docs/design/undeclared-keys.md): the mirror's read raises on the first such row (``has_undeclared``, evaluated
in the same pass as the typed projection), the Postgres digest hashes them (parity/canonical.py), the reverse
re-sync and ``complete`` refuse while rows hold them. ``find`` names them — only once something was refused,
or where a verb reads every row anyway — and ``describe`` says what to do, in one line.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

import psycopg
from psycopg import sql

from lakehouse_dagster.tracking.datasets import rows as dataset_rows

SHOWN = 3  # keys named in a message; the rest are counted
_PARAM = sql.SQL("%(names)s::text[]")


def declared_array(names: Sequence[str]) -> sql.Composable:
    """The declared column names as a text[] literal (no parameter: it sits in generated row expressions)."""
    if not names:
        return sql.SQL("'{}'::text[]")
    return sql.SQL("array[{}]::text[]").format(sql.SQL(", ").join(sql.Literal(n) for n in names))


def extra(names: Sequence[str] | sql.Composable, data: sql.Composable = sql.SQL("data")) -> sql.Composable:
    """The row's undeclared keys and their values, as a jsonb object ('{}' when it has none). ``names``: the
    declared names, or an expression of them (a query parameter)."""
    array = names if isinstance(names, sql.Composable) else declared_array(names)
    return sql.SQL("({} - {})").format(data, array)


def has_undeclared(names: Sequence[str] | sql.Composable, data: sql.Composable = sql.SQL("data")) -> sql.Composable:
    """True when the row holds a key outside ``names``: one jsonb delete per row, no set-returning function."""
    return sql.SQL("({} <> '{{}}'::jsonb)").format(extra(names, data))


@dataclasses.dataclass(frozen=True)
class Undeclared:
    """What ``find`` saw: the rows holding undeclared keys and the most frequent keys (key, rows)."""

    dataset_id: uuid.UUID
    rows: int
    keys: tuple[tuple[str, int], ...]
    key_count: int  # distinct undeclared keys in all

    def names(self) -> str:
        shown = ", ".join(f"{k!r} ({n} row{'s' if n != 1 else ''})" for k, n in self.keys[:SHOWN])
        more = self.key_count - min(len(self.keys), SHOWN)
        return shown + (f" and {more} more" if more > 0 else "")

    def describe(self) -> str:
        """One line: which keys, in how many rows, what to do."""
        first = self.keys[0][0] if self.keys else "<key>"
        return (
            f"dataset {self.dataset_id}: {self.rows} row(s) of dataset_rows hold {self.key_count} key(s) its "
            f"schema does not declare: {self.names()}; Iceberg holds only declared columns, so they would be "
            "lost: declare them in datasets.schema, or remove them from the rows ("
            f"{dataset_rows.remove_key_statement(first, self.dataset_id)})"
        )


def find(
    conn: psycopg.Connection,
    dataset_id: uuid.UUID,
    names: Sequence[str],
    *,
    row_indexes: Sequence[int] | None = None,
    limit: int = SHOWN,
) -> Undeclared | None:
    """The undeclared keys of the dataset's rows (or of the rows at ``row_indexes``), None when there are none.
    One scan of those rows: call it to name what was refused, or where every row is read anyway."""
    only = sql.SQL(" and r.row_index = any(%(ri)s)") if row_indexes is not None else sql.SQL("")
    query = dataset_rows.undeclared_keys_query(
        extra(_PARAM, sql.SQL("r.data")), has_undeclared(_PARAM, sql.SQL("r.data")), only
    )
    params = {"ds": dataset_id, "names": list(names), "ri": list(row_indexes or []), "lim": max(1, limit)}
    row = conn.execute(query, params).fetchone()
    if row is None or not row[0]:
        return None
    return Undeclared(dataset_id, int(row[0]), tuple(zip(row[2], map(int, row[3]), strict=True)), int(row[1]))
