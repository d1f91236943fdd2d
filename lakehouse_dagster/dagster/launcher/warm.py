"""Imported by the forkserver only (WarmRunLauncher's ``warm_up``): work beyond imports that every run would otherwise
redo from cold, done once before the fork. Starts no thread (test_launcher counts the forkserver's threads). Only the
launcher's own package comes with it: the code location's modules are still imported after the fork.

numba's compiler: a trivial function compiled once, so a run's first call of a cached kernel (parity/lookup3.py)
costs ~0.02-0.05 s instead of ~0.85 s idle, ~2.5 s under load (measured in forked children).
"""

from numba import njit


@njit(cache=False)
def _one(x):
    return x + 1


_one(1)
