"""The faces the adapters (cli/, dagster/, service/) import, one module per capability: reverse.py, parity.py,
complete.py, flips.py, capture.py, lifecycle.py, flags.py, status.py, alerts.py, plans.py, datasets.py, schema.py,
mirror.py, reads.py, shadow.py, sources.py, lake.py, ingest_bench.py. A capability spans the layers cut along the
data flow, so its face sits above them, just below the service; a contract keeps the adapters from importing what
is behind it."""
