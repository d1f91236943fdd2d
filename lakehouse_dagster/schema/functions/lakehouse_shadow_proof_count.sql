-- lakehouse_shadow_proof_count: the current definition (defined by migration 0038_shadow_proofs).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- Folds each statement's new shadow comparisons into lakehouse_shadow_proofs (flags/proof.py): per reader, dataset
-- and schema digest, the matches, the failures (mismatch, error), the matches since the latest failure and its time.
-- Whoever inserts the comparisons (the shadow workers, a bench, a test), the proof follows; the retention that prunes
-- old comparisons never changes it. A statement's rows are taken in id order; two statements on one pair apply in
-- the order they lock its row.
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
