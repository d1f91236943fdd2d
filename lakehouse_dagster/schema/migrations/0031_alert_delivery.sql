-- Alerts as reliable as a webhook allows (status/alerts.py, issue 32).

-- Rollout plan events carry the id of the transaction that wrote them, so the alerts sensor reads them as the
-- recorder reads its streams (status/recording.py): a bigserial id is drawn before commit, and an event whose
-- transaction commits after a later one was read would be skipped by "id > last". Rows from before this migration
-- keep NULL (the column is added without a default first: no rewrite).
alter table lakehouse_rollout_events add column if not exists xid xid8;
alter table lakehouse_rollout_events alter column xid set default pg_current_xact_id();
create index if not exists lakehouse_rollout_events_xid_idx on lakehouse_rollout_events (xid, id);

-- Delivery: each event is retried with exponential backoff and jitter (next_attempt_at; NULL: due now), and goes out
-- in one post whose idempotency key (post_key) is fixed before the first attempt and kept across retries, so a post
-- that timed out but arrived is recognised by the receiver when it comes again.
alter table lakehouse_alerts add column if not exists next_attempt_at timestamptz;
alter table lakehouse_alerts add column if not exists post_key text;
create index if not exists lakehouse_alerts_post_key on lakehouse_alerts (post_key) where post_key is not null;
