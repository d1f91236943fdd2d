"""Issue 44 item 2: a job launched from the UI runs its steps in its own run process (no step process that imports
the code location again), and its launchpad names readers and writers as everything else does (`sync.full`).
The time a refused runbook job takes from the UI against the CLI is measured in test_e2e.py (the real stack)."""

from __future__ import annotations

import dagster as dg
import pytest

from lakehouse_dagster.dagster.definitions import build
from lakehouse_dagster.flags.registry import FLIPPABLE_WRITERS, READERS, SERVABLE_READERS
from lakehouse_dagster.sources.writers import WRITERS as SOURCE_WRITERS


@pytest.fixture(scope="module")
def defs() -> dg.Definitions:
    return build()


def test_every_job_runs_its_steps_in_the_run_process(defs):
    """The multiprocess executor starts a process per step, each importing the code location again (~5 s each on
    two cores): a four-step runbook job took 24 s to be refused from the UI where the CLI took 4 s."""
    jobs = list(defs.resolve_all_job_defs())
    assert {j.name for j in jobs} >= {"read_flip", "write_flip", "set_flag", "write_rollback", "complete", "canary"}
    multi = sorted(j.name for j in jobs if j.executor_def.name != dg.in_process_executor.name)
    assert not multi, f"jobs with a step process per step: {multi}"


def _enum_values(job: dg.JobDefinition, op: str, field: str) -> set[str]:
    config = job.graph.node_named(op).definition.config_schema.config_type
    kind = config.fields[field].config_type
    kind = getattr(kind, "inner_type", kind)  # Optional[...] is a Noneable around the enum
    return {v.config_value for v in kind.enum_values}


def test_the_launchpad_names_readers_and_writers_as_the_cli_does(defs):
    """`writer: sync.full`, `reader: export.stream`: the names of the registry, the CLI, the docs and the logs."""
    named = {
        ("write_flip", "write_flip_preflight", "writer"): {w.name for w in FLIPPABLE_WRITERS},
        ("write_rollback", "write_rollback_op", "writer"): {w.name for w in FLIPPABLE_WRITERS},
        ("write_flip_candidates", "write_flip_candidates_op", "writer"): {w.name for w in FLIPPABLE_WRITERS},
        ("read_flip", "read_flip_preflight", "reader"): {r.name for r in SERVABLE_READERS},
        ("read", "read_op", "reader"): set(READERS),
        ("ingest_job", "ingest_op", "writer"): set(SOURCE_WRITERS),
    }
    for (job, op, field), want in named.items():
        got = _enum_values(defs.resolve_job_def(job), op, field)
        assert got == want, (job, field, sorted(got))
    assert "sync.full" in _enum_values(defs.resolve_job_def("write_flip"), "write_flip_preflight", "writer")
