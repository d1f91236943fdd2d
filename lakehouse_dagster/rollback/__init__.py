"""Rolling a writer back from iceberg_native to pg without dropping or duplicating rows (runbook NB)."""
