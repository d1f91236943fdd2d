-- The dataset lifecycle (lifecycle/): one stored state per dataset, moved only by a transition that every verb asks
-- for under the lifecycle lock (flag sets and clears at any scope, reverse on/off, complete, restore, the mirror's
-- first snapshot). lakehouse_lifecycle: the current state, its reverse setting where the state has one, a version
-- bumped by every transition (pages order by it), the verb that moved it. lakehouse_lifecycle_history: every
-- transition, append-only. No backfill here: a dataset without a row has its state derived and stored the first
-- time anything asks (lifecycle/transition.py), so a database migrated by an earlier release needs nothing more.
create table if not exists lakehouse_lifecycle (
  dataset_id uuid primary key,
  state text not null
    check (state in ('pg', 'mirrored', 'read-flipped', 'native', 'completing', 'complete', 'restoring')),
  reverse boolean,                  -- native / completing / complete / restoring: whether the reverse mirror is on
  native_writers text[] not null default '{}',
  version bigint not null default 1,
  since timestamptz not null default now(),
  verb text not null,
  actor text not null
);

create table if not exists lakehouse_lifecycle_history (
  id bigserial primary key,
  at timestamptz not null default now(),
  dataset_id uuid not null,
  version bigint not null,
  before_state text,                -- null: the dataset's first recorded state
  before_reverse boolean,
  after_state text not null,
  after_reverse boolean,
  verb text not null,
  actor text not null,
  xid xid8 default pg_current_xact_id()
);
create index if not exists lakehouse_lifecycle_history_dataset_idx on lakehouse_lifecycle_history (dataset_id, id desc);

create or replace function lakehouse_lifecycle_history_append_only() returns trigger language plpgsql as $$
begin
  raise exception 'lakehouse_lifecycle_history is append-only (% refused)', tg_op;
end $$;

drop trigger if exists lakehouse_lifecycle_history_no_change on lakehouse_lifecycle_history;
create trigger lakehouse_lifecycle_history_no_change before update or delete on lakehouse_lifecycle_history
  for each statement execute function lakehouse_lifecycle_history_append_only();

-- The reverse mirror's position records the dataset's rows_version its apply left (the reverse's own writes do not
-- move it: no echo), so a write into Postgres by anything else since — the live app's row.edit, a pg writer — is
-- seen in O(1) at the next apply, which refuses instead of re-syncing those rows away (mirror/reverse.py).
alter table lakehouse_reverse_position add column if not exists rows_version bigint;
