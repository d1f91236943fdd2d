"""Dagster glue only: the code location (definitions.py), defs/ by domain (defs/shared: what they share), the warm
run launcher (launcher/, an instance plugin) and Dagster's private names behind functions (private_apis.py)."""
