-- The mirror's stream runs (mirror/stream.py): one row per shard, written by the run that holds the shard's lock.
-- Its heartbeat says the run is alive (the mirror_poller sensor replaces a run whose heartbeat went stale and sends
-- the shard's datasets to batch runs meanwhile); the rest is what `lakehouse status` and the overview show.
create table if not exists lakehouse_mirror_streams (
  shard_count integer not null,
  shard integer not null,
  run_id text,                        -- the run holding the shard now (or last)
  started_at timestamptz,             -- when that run took the shard's lock
  heartbeat_at timestamptz,           -- updated every second or so while it holds it
  deadline_at timestamptz,            -- when it hands over to its successor
  ended_at timestamptz,               -- set when it let go of the shard (null while it holds it, or after a kill)
  last_commit_at timestamptz,         -- its latest sync that landed
  last_dataset_id uuid,
  syncs bigint not null default 0,    -- syncs the holding run made
  failures bigint not null default 0,
  backlog integer not null default 0, -- changed datasets waiting for their sync at the last heartbeat
  lag_seconds double precision not null default 0,  -- how long the oldest of them has waited
  primary key (shard_count, shard)
);
