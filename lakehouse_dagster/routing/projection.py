"""What a routed read asks for: columns, limit, order. Validated once, so both paths refuse alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.tracking.datasets import IDENTITY_COLUMNS, Dataset


@dataclasses.dataclass(frozen=True)
class Projection:
    columns: tuple[str, ...]  # identity and/or dataset columns, in output order
    limit: int | None = None
    order_by_row_index: bool = False


def projection_for(
    dataset: Dataset,
    columns: Sequence[str] | str | None = None,
    *,
    limit: int | None = None,
    order_by_row_index: bool = False,
) -> Projection:
    """Default: identity columns then every dataset column. Unknown columns are refused by name."""
    known = list(IDENTITY_COLUMNS) + [c.name for c in dataset.columns]
    if isinstance(columns, str):
        columns = [c.strip() for c in columns.split(",") if c.strip()]
    if not columns:
        chosen = tuple(known)
    else:
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise BadInput(
                f"unknown column(s) {', '.join(map(repr, unknown))} in dataset {dataset.id}; "
                f"its columns are {', '.join(known)}"
            )
        chosen = tuple(dict.fromkeys(columns))
    if limit is not None and limit < 0:
        raise BadInput(f"--limit {limit} must be 0 or more")
    return Projection(chosen, limit, order_by_row_index)
