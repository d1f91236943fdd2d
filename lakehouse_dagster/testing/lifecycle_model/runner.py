"""Running the model: a number of sequences, derandomized (CI) or seeded (the bench)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from lakehouse_dagster.testing.lifecycle_model.base import Lifecycle
from lakehouse_dagster.testing.lifecycle_model.iceberg import LifecycleWithIceberg


def run(dsn: str, *, examples: int, steps: int, seed: int | None = None, catalog=None, lake_settings=None) -> None:
    """``examples`` random sequences of up to ``steps`` steps against ``dsn`` (raises on the first violation, with
    the shrunk sequence); ``seed`` None: derandomized (the same sequences every run, as CI wants). With
    ``catalog`` (and the ``lake_settings`` it was loaded with): the model with native writes into real tables."""
    machine: type[Lifecycle] = Lifecycle
    if catalog is not None:
        machine = LifecycleWithIceberg
        LifecycleWithIceberg.catalog, LifecycleWithIceberg.lake_settings = catalog, lake_settings
    machine.dsn = dsn
    case = machine.TestCase
    case.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=seed is None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    if seed is not None:
        from hypothesis import seed as with_seed  # lazy: only a seeded run (the bench) needs it

        with_seed(seed)(case.runTest)(case())
        return
    case().runTest()
