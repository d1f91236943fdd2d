"""The mirror: a dataset's Postgres rows read pinned to one snapshot, written to its Iceberg table; the poller that finds
changed datasets, the reaper that settles syncs that did not conclude, the orphan sweep, and the native-run marker
the mirror must respect; the reverse mirror (reverse.py: native commits applied back to dataset_rows)."""
