"""Reads and writes of ``dataset_rows`` by the mirror, the reverse mirror and the digests: counts, row-index bounds,
pinned reads. The statements are kept as they were where they moved from (hot paths: same text, same round trips)."""

from __future__ import annotations

# The table's name, for what names it as data rather than in a statement: a WAL relation (tracking/capture.py), a
# message to the operator ("copies them back into dataset_rows").
TABLE = "dataset_rows"
