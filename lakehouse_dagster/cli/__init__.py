"""The `lakehouse` command: every runbook step the Dagster UI does, from a terminal."""
