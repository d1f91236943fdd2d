
alter table lakehouse_pg_digest_state add column if not exists fill_version bigint;
alter table lakehouse_pg_digest_state add column if not exists applied_version bigint;

create table if not exists lakehouse_digest_capture (
  one boolean primary key default true check (one),
  mode text not null default 'triggers' check (mode in ('triggers', 'wal')),
  slot text,                                  -- the logical replication slot (pgoutput) while mode is wal
  applied_lsn pg_lsn,                         -- end of the last transaction the consumer has applied or skipped
  applying boolean not null default false,    -- the consumer has passed the switch to wal (see the switch table)
  changed_at timestamptz not null default now()
);
insert into lakehouse_digest_capture default values on conflict do nothing;

-- One row per switch, written in the switching transaction: in the slot's stream it marks exactly where
-- the triggers stopped (or started again) adding the hashes.
create table if not exists lakehouse_digest_capture_switch (
  id bigserial primary key,
  mode text not null check (mode in ('triggers', 'wal')),
  at timestamptz not null default now()
);
