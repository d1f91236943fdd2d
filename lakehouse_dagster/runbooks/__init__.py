"""The runbooks as steps: plain functions over a connection and a catalog, run by the CLI and the Dagster jobs."""
