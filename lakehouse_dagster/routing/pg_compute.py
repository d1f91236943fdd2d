"""The Postgres executor of a structured read: the plan as SQL over ``dataset_rows``.

The rows are typed by the mirror's own projection (mirror/pinned_read.py ``column_expr``: the same casts, NaN and
±Infinity from their strings, a value of the wrong JSON type raising with its row and column), in a subquery that
also applies the addressing on the indexed ``row_index`` (and ``row_id``); the predicate, order and aggregate are
the shared compilation (compute_sql.py) over its typed columns. Every query of one answer runs in one REPEATABLE
READ transaction: a float sum's partial query sees the same rows as the main one.
"""

from __future__ import annotations

import psycopg
import pyarrow as pa

from lakehouse_dagster.mirror.pinned_read import column_expr
from lakehouse_dagster.routing import compute
from lakehouse_dagster.routing.compute_sql import POSTGRES, Frag, I, P, T, addressing, join, predicate
from lakehouse_dagster.routing.request import Plan, referenced
from lakehouse_dagster.tracking.datasets import Dataset
from lakehouse_dagster.tracking.datasets.rows import FROM_ROWS_WHERE

_IDENTITY = {"__row_index": "row_index", "__row_id": "row_id::text", "__created_at": "created_at"}


def source(dataset: Dataset, plan: Plan) -> Frag:
    by_name = {c.name: c for c in dataset.columns}
    items = []
    for name in referenced(plan):
        expr = T(_IDENTITY[name]) if name in _IDENTITY else Frag((("sql", column_expr(by_name[name])),))
        items.append(expr + T(" as ") + I(name))
    conds = [T("dataset_id = ") + P(dataset.id, "uuid")]
    conds += addressing(plan, T("row_index"))
    if plan.row_ids is not None:
        conds.append(T("row_id = any(") + P(list(plan.row_ids), "uuid[]") + T(")"))
    # An aggregate reads every addressed row anyway: ``offset 0`` keeps the subquery whole, so each typed value is
    # computed once (pulled up, a column used twice — a where and a sum — would be projected from jsonb twice).
    fence = T(" offset 0") if plan.is_aggregate else T("")
    if by_row_index(plan):  # the typed projection is volatile, so the subquery stays whole: ask it for the order
        fence = T(" order by row_index")
    return (
        T("(select ")
        + join(", ", items)
        + Frag((("sql", FROM_ROWS_WHERE),))
        + join(" and ", conds)
        + fence
        + T(") as src")
    )


def by_row_index(plan: Plan) -> bool:
    return not plan.is_aggregate and bool(plan.order) and plan.order[0] == ("__row_index", False)


def read_postgres_compute(conn: psycopg.Connection, dataset: Dataset, plan: Plan) -> pa.Table:
    src = source(dataset, plan)
    conds = [predicate(POSTGRES, plan.where)] if plan.where is not None else []

    def run(frag: Frag) -> list[tuple]:
        query, params = POSTGRES.render(frag)
        return conn.execute(query, params).fetchall()

    outermost = conn.autocommit  # only a transaction this function begins can still choose its isolation
    with conn.transaction():
        if outermost:
            conn.execute("set transaction isolation level repeatable read")
        if outermost and by_row_index(plan) and plan.limit is not None:
            # a page in row_index order: walk the primary key in order and stop at the limit, rather than type every
            # row above the cursor and sort them (the planner prices the jsonb projection at nothing)
            conn.execute("set local enable_sort = off")
        return compute.answer(POSTGRES, plan, src, conds, run)
