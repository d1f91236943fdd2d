"""The lifecycle as a model (issue 42): random sequences of verbs, writes and events against a real Postgres, an
oracle checked after every step (lakehouse_dagster/testing/lifecycle_model/ says what it keeps and checks). CI runs
``LIFECYCLE_MODEL_EXAMPLES`` sequences (default 50: with plans, interrupted verbs; 8 more with Iceberg, ``LIFECYCLE_MODEL_ICEBERG_EXAMPLES``); bench/bench_lifecycle_model.py runs thousands with seeds."""

from __future__ import annotations

import os

import pytest

from lakehouse_dagster.testing import lifecycle_model


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
@pytest.mark.timeout(900)
def test_random_sequences_of_verbs_and_writes_keep_the_lifecycle(dsn, settings):
    lifecycle_model.run(
        dsn,
        examples=int(os.environ.get("LIFECYCLE_MODEL_EXAMPLES", "50")),
        steps=int(os.environ.get("LIFECYCLE_MODEL_STEPS", "25")),
        settings=settings,
    )


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
@pytest.mark.timeout(900)
def test_random_sequences_with_native_writes_and_raw_app_statements_keep_the_lifecycle(dsn, settings):
    """The same model with the native path into real Iceberg tables and the live app's raw INSERT (the reverse
    mirror's O(1) detection): fewer sequences, each dataset has a table."""
    from lakehouse_dagster.lake.catalog import load_catalog

    lifecycle_model.run(
        dsn,
        examples=int(os.environ.get("LIFECYCLE_MODEL_ICEBERG_EXAMPLES", "8")),
        steps=int(os.environ.get("LIFECYCLE_MODEL_STEPS", "25")),
        catalog=load_catalog(settings, dsn),
        lake_settings=settings,
    )
