"""Another engine's append reusing a row_index the dataset already has (found by the lifecycle model, issue 42,
seed 4102 of the bench): the reverse mirror's full re-sync copied both rows into ``dataset_rows``, whose key is
(dataset_id, row_index), and failed with the driver's raw unique-violation text. It must refuse in one line, naming
the index and the ways on, with nothing written."""

from __future__ import annotations

import pytest

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.reverse import apply_reverse

from .native_helpers import native_write, ready_native, row
from .test_foreign_commits import _foreign_append


def _pg(conn, d) -> list[tuple]:
    return conn.execute(
        "select row_index, row_id from dataset_rows where dataset_id = %s order by row_index", (d,)
    ).fetchall()


def test_a_foreign_append_reusing_a_row_index_is_refused_by_the_reverse_in_one_line_with_nothing_written(
    conn, dsn, settings
):
    d = ready_native(conn, dsn, settings, "sync.append")
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 8)], start=6)
    catalog = load_catalog(settings, dsn)
    assert apply_reverse(dsn, catalog, settings, d).pg_rows == 8
    before = _pg(conn, d)
    _foreign_append(settings, dsn, d, 1, start=3)  # row_index 3: the table (and Postgres) hold a row there already

    with pytest.raises(BadInput) as refused:
        apply_reverse(dsn, catalog, settings, d)

    text = str(refused.value)
    assert "\n" not in text and "row_index 3" in text and "nothing was written" in text, text
    assert "lakehouse reverse off" in text, text
    assert _pg(conn, d) == before
