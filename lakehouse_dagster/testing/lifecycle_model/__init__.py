"""The lifecycle as a model (issue 42): random sequences of verbs at dataset / workspace / global scope — writer and
reader flags set and cleared past the gates (the lifecycle must hold without them), the reverse on / off / cleared,
complete started and finished, restores, the forward mirror's first snapshot — interleaved with writes on the pg
path, against a real Postgres. An oracle of our own keeps what the facts are, where every row written must be, and
which moves may happen; after every step it checks: the stored state is the true one, no state outside the table
exists, no accepted row is lost or doubled, a write into the store that is not the truth is refused with nothing
written, and every refusal names a legal way on.

oracle.py (the facts and the rules, on their own), base.py (the machine: verbs, pg writes, invariants), plans.py
(rollout plans: ticks, analyses, aborts), crashes.py (verbs interrupted at their fault points), iceberg.py (native
writes, another engine, raw app statements), ingest.py (the service's and the poller's ingests), ready.py (datasets
readied and write-flipped the runbook's way, the reverse apply), kills.py (an ingest SIGKILLed), runner.py
(``run``, ``first_failure``), steps.py (the rules, each step recorded). Shared by test_lifecycle_model.py (a few dozen sequences in CI) and bench/bench_lifecycle_model.py.
"""

from lakehouse_dagster.testing.lifecycle_model.base import Lifecycle
from lakehouse_dagster.testing.lifecycle_model.iceberg import LifecycleWithIceberg
from lakehouse_dagster.testing.lifecycle_model.oracle import READER, SCHEMA, WRITERS, Oracle
from lakehouse_dagster.testing.lifecycle_model.runner import first_failure, run

__all__ = ["READER", "SCHEMA", "WRITERS", "Lifecycle", "LifecycleWithIceberg", "Oracle", "first_failure", "run"]
