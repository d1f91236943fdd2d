"""Dagster definitions of the recording area: every change of a dataset shown on the instance."""
