-- Rollout plans (issue 24): a declarative plan per reader or writer, advanced by the rollout_controller sensor.
-- Every state the controller acts on lives here, so a daemon killed mid-stage resumes from it (plans/store.py).

-- One row per plan. state: active | paused | aborting | aborted | finished; stage: the current stage (0-based);
-- phase: where that stage is (waiting | flipping | soaking | analyzing); reason: why it paused or aborted;
-- blocking: what the controller waits for now (an approval, the window, the soak, a run).
create table if not exists lakehouse_rollout_plans (
  id uuid primary key,
  kind text not null check (kind in ('read', 'write')),
  name text not null,
  mode text not null,
  spec jsonb not null,
  source text,
  rendered jsonb not null,
  state text not null default 'active'
    check (state in ('active', 'paused', 'aborting', 'aborted', 'finished')),
  stage int not null default 0,
  phase text not null default 'waiting',
  reason text,
  blocking text,
  created_by text not null,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  ended_at timestamptz
);
-- Two live plans of one reader or writer would undo each other's changes on abort: one at a time.
create unique index if not exists lakehouse_rollout_plans_live_idx
  on lakehouse_rollout_plans (kind, name) where state in ('active', 'paused', 'aborting');

-- Per stage: when it flipped, passed, was approved, and since when its analysis is inconclusive.
create table if not exists lakehouse_rollout_stages (
  plan_id uuid not null references lakehouse_rollout_plans (id) on delete cascade,
  stage int not null,
  started_at timestamptz,
  flipped_at timestamptz,
  passed_at timestamptz,
  approved_at timestamptz,
  approved_by text,
  approval_note text,
  inconclusive_since timestamptz,
  moved uuid[] not null default '{}',
  primary key (plan_id, stage)
);

-- Each run the controller asks for: a flag change (the flip job) or an analysis (the canary). The key is the
-- run key of the Dagster run, written before the run is requested: a tick that dies after writing it asks again
-- under the same key, which Dagster deduplicates, so a step runs once.
create table if not exists lakehouse_rollout_steps (
  plan_id uuid not null references lakehouse_rollout_plans (id) on delete cascade,
  step_key text not null,
  stage int not null,
  kind text not null check (kind in ('flip', 'analysis')),
  job text not null,
  config jsonb not null,
  status text not null default 'requested' check (status in ('requested', 'succeeded', 'failed')),
  run_id text,
  moved uuid[] not null default '{}',
  detail text,
  requested_at timestamptz not null default now(),
  finished_at timestamptz,
  primary key (plan_id, step_key)
);

-- The value every flag key the plan changes had before the plan (null: no override): abort restores it.
create table if not exists lakehouse_rollout_flags (
  plan_id uuid not null references lakehouse_rollout_plans (id) on delete cascade,
  kind text not null,
  name text not null,
  scope text not null,
  scope_id uuid,
  before_mode text,
  recorded_at timestamptz not null default now(),
  restored_at timestamptz,
  restore_detail text
);
create unique index if not exists lakehouse_rollout_flags_key_idx on lakehouse_rollout_flags
  (plan_id, kind, name, scope, coalesce(scope_id, '00000000-0000-0000-0000-000000000000'::uuid));

-- Every plan event, append-only: started, stage-started, stage-passed, approval-needed, approved, paused, resumed,
-- aborting, aborted, finished. severity: info | warning | error. What an alert sender reads (id is its cursor).
create table if not exists lakehouse_rollout_events (
  id bigserial primary key,
  plan_id uuid not null references lakehouse_rollout_plans (id) on delete cascade,
  at timestamptz not null default now(),
  stage int,
  event text not null,
  severity text not null default 'info' check (severity in ('info', 'warning', 'error')),
  reason text,
  actor text,
  detail jsonb
);
create index if not exists lakehouse_rollout_events_plan_idx on lakehouse_rollout_events (plan_id, id);

-- Shadow reads (read mode shadow): a sample of reads served by Postgres also read from Iceberg off the request
-- path and compared order-independently (routing/shadow.py). outcome: match | mismatch (caught up and
-- different) | lagging (Iceberg behind, or Postgres moved during the read: not compared) | no-snapshot |
-- not-comparable (a limited unordered read without __row_index) | error (the Iceberg side failed).
create table if not exists lakehouse_shadow_reads (
  id bigserial primary key,
  at timestamptz not null default now(),
  reader text not null,
  dataset_id uuid not null,
  outcome text not null,
  pg_version bigint,
  snapshot_id bigint,
  iceberg_version bigint,
  pg_rows int,
  iceberg_rows int,
  pg_row jsonb,
  iceberg_row jsonb,
  detail text,
  seconds double precision
);
create index if not exists lakehouse_shadow_reads_reader_idx on lakehouse_shadow_reads (reader, at);
create index if not exists lakehouse_shadow_reads_dataset_idx on lakehouse_shadow_reads (dataset_id, at);

-- A plan's analysis reads the verdicts its canary run recorded, by run id, and the read fallbacks since its stage
-- flipped, by time (the controller looks every tick: recent rows first, then the plan's datasets).
create index if not exists lakehouse_read_parity_run_idx on lakehouse_read_parity (run_id) where run_id is not null;
create index if not exists lakehouse_read_fallbacks_at_idx on lakehouse_read_fallbacks (at);
