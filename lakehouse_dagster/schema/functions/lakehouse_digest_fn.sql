-- lakehouse_digest_fn: the current definition (defined by migration 020_app_write_cost).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- Creates (once, under an advisory lock) and names the function computing the per-segment (count, sum) deltas
-- of an array of signed rows under one row hash expression (parity/maintained.py registers datasets with it).
create or replace function lakehouse_digest_fn(p_hash_sql text) returns text language plpgsql as $$
declare fn text := 'lakehouse_rowdigest_' || md5(p_hash_sql);
begin
  if to_regproc(fn) is null then
    perform pg_advisory_xact_lock(441319456, hashtext(fn));  -- class 0x1A4E_0020, beside the fill's 0x1A4E_0015
    if to_regproc(fn) is null then
      execute format(
        'create function %I(signed lakehouse_digest_row[]) returns lakehouse_digest_delta[]'
        ' language plpgsql stable set plan_cache_mode = force_generic_plan as %L', fn,
        'begin return (select array_agg(row(d.seg, d.n, d.s)::lakehouse_digest_delta) from ('
        ' select row_index >> 16 as seg, sum(sign)::bigint as n, sum(sign * (' || p_hash_sql || ')::numeric) as s'
        ' from unnest(signed) group by 1) d where d.n <> 0 or d.s <> 0); end');
    end if;
  end if;
  return fn;
end $$;
