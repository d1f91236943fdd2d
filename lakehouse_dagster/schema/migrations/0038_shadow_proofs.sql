-- The shadow proof of each (reader, dataset, schema digest), kept as comparisons are recorded (issue 43, flags/proof.py):
-- matches, failures (mismatch, error), the matches since the latest failure, its time. The proof a flip asks for is
-- read from here, one row per pair, so it costs the pairs, not the comparisons, and the retention that prunes old rows
-- of lakehouse_shadow_reads (flags/proof.py prune_shadow_reads) cannot change it. Filled from the comparisons already
-- recorded, then by a statement trigger on lakehouse_shadow_reads (its function: schema/functions).
create table if not exists lakehouse_shadow_proofs (
  reader text not null,
  dataset_id uuid not null,
  schema_digest text not null,
  matched bigint not null default 0,
  failed bigint not null default 0,
  in_a_row bigint not null default 0,
  last_failure timestamptz,
  last_id bigint not null,
  primary key (reader, dataset_id, schema_digest)
);

create or replace function lakehouse_shadow_proof_count() returns trigger language plpgsql as $$
begin
  insert into lakehouse_shadow_proofs as p
         (reader, dataset_id, schema_digest, matched, failed, in_a_row, last_failure, last_id)
  select reader, dataset_id, schema_digest,
         count(*) filter (where outcome = 'match'),
         count(*) filter (where outcome <> 'match'),
         count(*) filter (where outcome = 'match' and id > coalesce(last_failed_id, 0)),
         max(at) filter (where outcome <> 'match'),
         max(id)
    from (select n.reader, n.dataset_id, n.schema_digest, n.outcome, n.id, n.at,
                 max(n.id) filter (where n.outcome <> 'match')
                   over (partition by n.reader, n.dataset_id, n.schema_digest) as last_failed_id
            from new_rows n
           where n.outcome in ('match', 'mismatch', 'error') and n.schema_digest is not null) x
   group by reader, dataset_id, schema_digest
   order by reader, dataset_id, schema_digest  -- rows locked in one order: two statements never deadlock
  on conflict (reader, dataset_id, schema_digest) do update
     set matched = p.matched + excluded.matched,
         failed = p.failed + excluded.failed,
         in_a_row = case when excluded.failed > 0 then excluded.in_a_row else p.in_a_row + excluded.in_a_row end,
         last_failure = greatest(p.last_failure, excluded.last_failure),
         last_id = greatest(p.last_id, excluded.last_id);
  return null;
end $$;

-- The trigger first (its lock waits for the inserts in flight and holds new ones), then what was recorded before it.
drop trigger if exists lakehouse_shadow_proof_count on lakehouse_shadow_reads;
create trigger lakehouse_shadow_proof_count after insert on lakehouse_shadow_reads
  referencing new table as new_rows for each statement execute function lakehouse_shadow_proof_count();

insert into lakehouse_shadow_proofs (reader, dataset_id, schema_digest, matched, failed, in_a_row, last_failure, last_id)
select reader, dataset_id, schema_digest,
       count(*) filter (where outcome = 'match'),
       count(*) filter (where outcome <> 'match'),
       count(*) filter (where outcome = 'match' and id > coalesce(last_failed_id, 0)),
       max(at) filter (where outcome <> 'match'),
       max(id)
  from (select s.reader, s.dataset_id, s.schema_digest, s.outcome, s.id, s.at,
               max(s.id) filter (where s.outcome <> 'match')
                 over (partition by s.reader, s.dataset_id, s.schema_digest) as last_failed_id
          from lakehouse_shadow_reads s
         where s.outcome in ('match', 'mismatch', 'error') and s.schema_digest is not null) x
 group by reader, dataset_id, schema_digest
on conflict (reader, dataset_id, schema_digest) do nothing;
