"""The warm run launcher, an instance plugin (dagster.yaml: ``module: lakehouse_dagster.dagster.launcher.run_launcher``): each
run in a child forked from a forkserver that already imported the heavy modules. Plain-Python parts: which code the
forkserver loaded (location.py), which process is a run worker (worker_process.py), the numba warm-up (warm.py)."""
