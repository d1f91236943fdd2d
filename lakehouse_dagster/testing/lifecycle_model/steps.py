"""The model's ``rule`` and ``invariant``: hypothesis' own, with every step recorded, so the first failure of a run is
kept with the steps that led to it whatever hypothesis does next.

Why: a failing sequence is replayed by hypothesis before it is reported. When the replay does not fail the same way
(the world of a real Postgres and real tables is not hypothesis' to reset) hypothesis reports "Flaky" or
"Inconsistent data generation" instead, and the failure itself — the exception, the steps — was lost (seeds 3119 and
4127 of the bench). ``runner.first_failure()`` returns it; the bench prints it.
"""

from __future__ import annotations

import functools
import traceback
from typing import Any

from hypothesis import stateful

FIRST: dict[str, Any] = {"failure": None}  # the first failure of the run: its steps and its traceback (text)


def _record(machine: Any, name: str, args: dict, call) -> Any:
    trace = machine.__dict__.setdefault("step_trace", [])
    depth = machine.__dict__.get("step_depth", 0)
    if depth == 0 and not name.startswith("invariant "):
        trace.append(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})")
    machine.step_depth = depth + 1
    try:
        return call()
    except BaseException:
        if depth == 0 and FIRST["failure"] is None:
            steps = "\n".join(f"  {i + 1}. {s}" for i, s in enumerate(trace))
            FIRST["failure"] = f"in {name}, after the steps:\n{steps}\n{traceback.format_exc()}"
        raise
    finally:
        machine.step_depth = depth


def rule(**strategies):
    """hypothesis' ``rule``, the step recorded (name, arguments) and its first failure kept."""

    def wrap(fn):
        @functools.wraps(fn)
        def step(self, *a, **kw):  # called by hypothesis with keywords, by another step with positions
            return _record(self, fn.__name__, kw, lambda: fn(self, *a, **kw))

        return stateful.rule(**strategies)(step)

    return wrap


def initialize():
    """hypothesis' ``initialize``, its first failure kept."""

    def wrap(fn):
        @functools.wraps(fn)
        def start(self):
            return _record(self, fn.__name__, {}, lambda: fn(self))

        return stateful.initialize()(start)

    return wrap


def invariant():
    """hypothesis' ``invariant``, its first failure kept with the steps before it."""

    def wrap(fn):
        @functools.wraps(fn)
        def check(self):
            return _record(self, f"invariant {fn.__name__}", {}, lambda: fn(self))

        return stateful.invariant()(check)

    return wrap
