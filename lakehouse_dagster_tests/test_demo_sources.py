"""The demo's source-fed datasets: Parquet + CSV files under LAKEHOUSE_HOME, a Postgres table and a CDC table
in the project's own Postgres, each with its source set — and each ingests for real with its default writer."""

from __future__ import annotations

import pytest

from lakehouse_dagster.demo.workspace import (
    ACCOUNTS_ROWS,
    CLICKS_FILES,
    CLICKS_ROWS_PER_FILE,
    INVENTORY_ROWS,
    demo_id,
    seed_demo,
)
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity.canary import evaluate
from lakehouse_dagster.sources import get_source
from lakehouse_dagster.sources.writers import pending_source_changes, run_writer

EXPECTED = {  # name → (source type, default writer, rows after the first ingest)
    "web_clicks": ("files", "sync.append", CLICKS_FILES * CLICKS_ROWS_PER_FILE),
    "web_clicks_csv": ("files", "sync.append", CLICKS_ROWS_PER_FILE),
    "crm_accounts": ("postgres", "sync.full", ACCOUNTS_ROWS),
    "inventory_changes": ("cdc", "cdc.append", INVENTORY_ROWS),
}


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_the_demo_seeds_three_kinds_of_source_and_each_ingests(conn, dsn, settings):
    summary = seed_demo(conn, big_rows=500, home=settings.project.home)
    assert summary["created"]
    directory = settings.project.home / "demo" / "web_clicks"
    assert sorted(p.suffix for p in directory.iterdir()) == [".csv"] + [".parquet"] * CLICKS_FILES
    catalog = load_catalog(settings, dsn)
    for name, (kind, writer, rows) in EXPECTED.items():
        d = demo_id(name)
        spec = get_source(conn, d)
        assert (spec.type, spec.default_writer) == (kind, writer), name
        assert pending_source_changes(dsn, settings, d) is not None, name  # something new: never ingested
        r = run_writer(dsn, catalog, settings, FlagResolver(conn, ttl_seconds=0), d, writer)
        assert (r.path, r.rows) == ("pg", rows), name
        assert pending_source_changes(dsn, settings, d) is None, name
    # the runbook's next step on real data: the mirror, then the canary says ok
    d = demo_id("crm_accounts")
    sync_dataset(dsn, catalog, settings, d)
    v = evaluate(dsn, catalog, settings, d)
    assert (v.verdict, v.pg_count) == ("ok", ACCOUNTS_ROWS)
    # seeding again writes nothing (the demo is there)
    assert seed_demo(conn, big_rows=500, home=settings.project.home)["created"] is False
