
-- The scheduled canary picks the flipped datasets whose last scheduled verdict is oldest (runbooks/canary_rounds.py):
-- one index probe per dataset, however many unscheduled check verdicts the mirror recorded since.
create index if not exists lakehouse_read_parity_schedule_idx
  on lakehouse_read_parity (dataset_id, checked_at desc, id desc) where source = 'schedule';

-- Alerts (status/alerts.py): every event once. An event is recorded here when the alert sensor first sees it and
-- posted from here, so a restart neither posts it again nor loses it, and a post that failed is retried.
create table if not exists lakehouse_alerts (
  id bigserial primary key,
  key text not null,                 -- what the event is: <kind>:<its own id> (a parity row, a run, a sync, a dataset)
  kind text not null,                -- run_failed | mismatch | auto_rollback | wedged | freshness | native_unsafe
  dataset_id uuid,
  message text not null,             -- the text posted (never the webhook URL)
  created_at timestamptz not null default now(),
  attempts integer not null default 0,
  last_error text,                   -- the last failed post: the receiver's host and why, never the URL
  posted_at timestamptz,
  dropped_at timestamptz,            -- given up after LAKEHOUSE_ALERT_MAX_ATTEMPTS failed posts
  resolved_at timestamptz            -- a condition (wedged, freshness, native_unsafe) that no longer holds
);
-- One open event per key: a condition that ends and comes back later is a new event.
create unique index if not exists lakehouse_alerts_open_key on lakehouse_alerts (key) where resolved_at is null;
create index if not exists lakehouse_alerts_pending on lakehouse_alerts (id) where posted_at is null and dropped_at is null;
