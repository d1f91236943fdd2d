-- The recorder (status/recording.py) reads two more facts by the id of the transaction that wrote them, so a
-- dataset's partition page follows every verdict and every read fallback, whoever recorded it (the CLI canary, a
-- job, a rollout stage, the read router in any process, an app that keeps its own router through
-- POST /lakehouse/fallback). Rows from before this migration keep NULL: history is not replayed (the first
-- recorded event of each dataset shows its newest verdict anyway).
alter table lakehouse_read_parity add column if not exists xid xid8;
alter table lakehouse_read_parity alter column xid set default pg_current_xact_id();
create index if not exists lakehouse_read_parity_xid_idx on lakehouse_read_parity (xid, id);

alter table lakehouse_read_fallbacks add column if not exists xid xid8;
alter table lakehouse_read_fallbacks alter column xid set default pg_current_xact_id();
create index if not exists lakehouse_read_fallbacks_xid_idx on lakehouse_read_fallbacks (xid, id);
