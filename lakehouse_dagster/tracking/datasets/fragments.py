"""SQL fragments naming ``datasets``/``dataset_rows`` for statements owned elsewhere that must read a dataset's row
inside the same statement (a keyset scan, a lateral probe per dataset, an atomic update, an insert ... select): the
owner hands the table and how it is joined, the caller composes them in. ``d`` aliases the datasets row; the column
expressions passed in are the caller's own (``p.dataset_id``), never a value."""

from __future__ import annotations

from psycopg import sql

# The datasets as the driving table of a statement, one row per dataset (``d``).
FROM_DATASETS = "from datasets d"

# One dataset's row, unaliased (its id: the next parameter), for an ``insert ... select`` of its columns.
FROM_ONE_DATASET = "from datasets where id = %s"

# One dataset's rows (its id: the next parameter), for an ``insert ... select`` or an aggregate over them.
FROM_ROWS_OF_DATASET = "from dataset_rows where dataset_id = %s"


def join_datasets_on(dataset_id: str) -> str:
    """``join datasets d`` on the caller's column holding a dataset's id."""
    return "join datasets d on d.id = " + dataset_id


def dataset_exists(dataset_id: str, also: str = "") -> str:
    """``exists (...)``: a dataset row has the caller's id column (and ``also``, a condition on ``d``)."""
    return "exists (select 1 from datasets d where d.id = " + dataset_id + also + ")"


def rows_version_of(ds: sql.Composable) -> sql.Composed:
    """The dataset's rows_version as a scalar subquery (``ds``: its id, a literal)."""
    return sql.SQL("(select rows_version from datasets where id = {ds}::uuid)").format(ds=ds)
