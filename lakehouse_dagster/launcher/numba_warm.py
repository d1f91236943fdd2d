"""Imported by the forkserver only (WarmRunLauncher's ``warm_numba``): compiles a trivial numba function once, so
numba's compiler is initialised before the fork. Each run's first call of a cached kernel (parity/lookup3.py) then
costs ~0.02 s instead of ~0.85 s (measured). No thread is started (test_launcher counts the forkserver's threads).
Only the launcher's own modules come with it: the code location's modules are still imported after the fork."""

from numba import njit


@njit(cache=False)
def _one(x):
    return x + 1


_one(1)
