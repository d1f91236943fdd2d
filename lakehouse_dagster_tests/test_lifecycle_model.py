"""The lifecycle as a model (issue 42): random sequences of verbs, writes and events against a real Postgres, an
oracle checked after every step (lakehouse_dagster/testing/lifecycle_model.py says what it keeps and checks). CI runs
``LIFECYCLE_MODEL_EXAMPLES`` sequences (default 30); bench/bench_lifecycle_model.py runs thousands with seeds."""

from __future__ import annotations

import os

import pytest

from lakehouse_dagster.testing import lifecycle_model


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
@pytest.mark.timeout(900)
def test_random_sequences_of_verbs_and_writes_keep_the_lifecycle(dsn):
    lifecycle_model.run(
        dsn,
        examples=int(os.environ.get("LIFECYCLE_MODEL_EXAMPLES", "30")),
        steps=int(os.environ.get("LIFECYCLE_MODEL_STEPS", "25")),
    )
