"""SQL fragments naming ``datasets`` for statements owned elsewhere that must read a dataset's row inside the same
statement (a keyset scan, a lateral probe per dataset, an atomic update): the owner hands the table and how it is
joined, the caller composes them in. Every fragment aliases the table ``d``; the column expressions passed in are the
caller's own (``p.dataset_id``), never a value."""

from __future__ import annotations

# The datasets as the driving table of a statement, one row per dataset (``d``).
FROM_DATASETS = "from datasets d"


def join_datasets_on(dataset_id: str) -> str:
    """``join datasets d`` on the caller's column holding a dataset's id."""
    return "join datasets d on d.id = " + dataset_id


def dataset_exists(dataset_id: str, also: str = "") -> str:
    """``exists (...)``: a dataset row has the caller's id column (and ``also``, a condition on ``d``)."""
    return "exists (select 1 from datasets d where d.id = " + dataset_id + also + ")"
