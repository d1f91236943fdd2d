"""Support for the tests (lakehouse_dagster_tests) and the benchmarks (bench/), which share it: a database per
test or bench (pg.py), the app's tables as a live deployment has them (foundation.py), the CLI run as a real
process with failpoints armed (faults.py), the crash harness (crash_harness.py), the reference digests of the
maintained parity (parity.py). The top layer (pyproject.toml): nothing of the package imports it."""
