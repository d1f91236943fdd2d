"""Values that can be missing at run time, found by turning mypy's strict_optional on: each refuses with a line
that says what was missing (a project error), where it used to fail on ``None[0]`` or a None unpacked."""

from __future__ import annotations

import uuid

import pytest

from lakehouse_dagster.core.db import fetch_one, fetch_value
from lakehouse_dagster.core.errors import BadInput, LakehouseError, NotFound
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.plans import store
from lakehouse_dagster.runbooks.flip import verify_write
from lakehouse_dagster.sources.files import list_files
from lakehouse_dagster.sources.spec import SourceSpec


def test_fetch_one_returns_the_row_or_names_what_was_missing(conn):
    assert fetch_one(conn.execute("select 1, 'a'"), "two values") == (1, "a")
    assert fetch_value(conn.execute("select 42"), "the answer") == 42
    with pytest.raises(LakehouseError) as got:
        fetch_value(conn.execute("select 1 where false"), "the count of the dataset's rows")
    assert type(got.value) is LakehouseError
    assert "no row for the count of the dataset's rows" in str(got.value)
    assert "lakehouse db migrate" in str(got.value)  # what to do
    gone = NotFound("dataset x does not exist")
    with pytest.raises(NotFound) as got:
        fetch_one(conn.execute("select 1 where false"), gone)
    assert got.value is gone


def test_a_rest_catalog_configured_without_its_uri_refuses(settings, dsn):
    """Settings.from_env refuses it, but Settings.replace (the Dagster resource's config) skipped that check and
    handed pyiceberg uri=None."""
    with pytest.raises(BadInput, match="LAKEHOUSE_CATALOG_URI"):
        load_catalog(settings.replace(catalog={"type": "rest", "uri": None}), dsn)


def test_the_stage_row_of_a_missing_plan_is_not_found(conn):
    plan_id = uuid.uuid4()
    with pytest.raises(NotFound, match=f"rollout plan {plan_id} has no stage 1"):
        store.stage_row(conn, plan_id, 1)
    with pytest.raises(NotFound, match=f"rollout plan {plan_id} has no stage 2"):
        store.set_stage_moved(conn, plan_id, 2)


def test_verify_write_of_a_dataset_that_no_longer_exists_is_not_found(conn):
    gone = uuid.uuid4()
    with pytest.raises(NotFound, match=f"dataset {gone} does not exist"):
        verify_write(conn, "sync.full", [gone])


def test_a_files_source_without_its_uri_refuses(settings):
    with pytest.raises(BadInput, match="this files source has no uri"):
        list_files(SourceSpec("files", format="csv"), settings.s3)
