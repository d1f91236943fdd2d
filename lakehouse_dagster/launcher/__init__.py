"""The warm run launcher's plain-Python parts, imported by its forkserver before anything of Dagster's glue: which
code the forkserver loaded (location.py), which process is a run worker (worker_process.py), the numba warm-up
(warm.py). The launcher itself and the worker's run body are Dagster glue: defs/run_launcher.py, defs/run_worker.py
(dagster.yaml: ``module: lakehouse_dagster.defs.run_launcher``)."""
