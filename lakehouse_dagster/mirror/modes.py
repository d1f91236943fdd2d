"""The sync modes, apart from mirror/sync.py so `lakehouse sync`'s parser offers them without importing pyiceberg."""

MODES = ("auto", "full", "incremental")  # auto may run partial (tracking/row_changes.py)
