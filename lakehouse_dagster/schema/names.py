"""Names the SQL of schema/migrations and schema/functions defines and Python code refers to (a test checks
each against the SQL)."""

# Every committed change of the flag overrides NOTIFYs this channel (functions/lakehouse_flag_overrides_notify.sql);
# flags/listen.py LISTENs on it.
FLAG_NOTIFY_CHANNEL = "lakehouse_flags"

# A statement writing more rows of one registered dataset than this keeps the set-based digest path
# (functions/lakehouse_digest_rows.sql: "limit 1001" and "> 1000").
DIGEST_ARRAY_ROWS = 1000

# The latest succeeded sync of a dataset (functions/lakehouse_latest_succeeded_sync.sql); tracking/sync_log.py.
LATEST_SUCCEEDED_FN = "lakehouse_latest_succeeded_sync"
