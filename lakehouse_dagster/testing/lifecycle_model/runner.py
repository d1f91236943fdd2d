"""Running the model: a number of sequences, derandomized (CI) or seeded (the bench)."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase
from hypothesis import settings as run_settings

from lakehouse_dagster.testing.lifecycle_model.base import Lifecycle
from lakehouse_dagster.testing.lifecycle_model.iceberg import LifecycleWithIceberg
from lakehouse_dagster.testing.lifecycle_model.steps import FIRST


def run(
    dsn: str,
    *,
    examples: int,
    steps: int,
    seed: int | None = None,
    catalog=None,
    lake_settings=None,
    settings=None,
) -> None:
    """``examples`` random sequences of up to ``steps`` steps against ``dsn`` (raises on the first violation, with
    the shrunk sequence); ``seed`` None: derandomized (the same sequences every run, as CI wants). With
    ``catalog`` (and the ``lake_settings`` it was loaded with): the model with native writes into real tables. ``settings``: the project's (the plans' controller reads
    them; ``lake_settings`` when given). The first failure, whatever hypothesis makes of its replay, is
    ``first_failure()`` afterwards."""
    FIRST["failure"] = None
    machine: type[Lifecycle] = Lifecycle
    Lifecycle.settings = settings or lake_settings
    if catalog is not None:
        machine = LifecycleWithIceberg
        LifecycleWithIceberg.catalog, LifecycleWithIceberg.lake_settings = catalog, lake_settings
    machine.dsn = dsn
    # hypothesis reads a state machine's seed from the machine class (run_state_machine_as_test), not from the
    # TestCase's runTest: a seed put on runTest was ignored, so every "seeded" round before drew at random. The seed
    # goes on a subclass of this run's own, so no later run of the process inherits it.
    machine = type(machine.__name__, (machine,), {"__module__": machine.__module__})
    if seed is not None:
        from hypothesis import seed as with_seed  # lazy: only a seeded run (the bench) needs it

        with_seed(seed)(machine)
    case = machine.TestCase
    case.settings = run_settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=seed is None,
        database=None,
        suppress_health_check=list(HealthCheck),
        # a seeded run (the bench) reports its first violation as found: shrinking a sequence against real tables
        # took over five minutes a time
        phases=tuple(Phase) if seed is None else (Phase.explicit, Phase.reuse, Phase.generate),
    )
    case().runTest()


def first_failure() -> str | None:
    """The first step (or invariant) of the last ``run`` that raised: its steps before it and its traceback."""
    return FIRST["failure"]
