"""The HTTP API the live app calls (POST /lakehouse/read, /lakehouse/ingest, routes, flags, metrics): the same core functions as the CLI and the jobs."""
