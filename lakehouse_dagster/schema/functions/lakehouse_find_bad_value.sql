-- lakehouse_find_bad_value: the current definition (defined by migration 003_iceberg_sync_log).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- The first row whose value fails to cast (mirror/sync.py, after the fast query failed): slow, only to name it.
create or replace function lakehouse_find_bad_value(ds uuid, cols jsonb)
returns table (row_index bigint, col text, typ text, got text) language plpgsql as $$
declare r record; c jsonb; v jsonb; dummy text;
begin
  for r in select d.row_index, d.data from dataset_rows d where d.dataset_id = ds order by d.row_index loop
    for c in select * from jsonb_array_elements(cols) loop
      v := r.data -> (c->>'name');
      continue when v is null or jsonb_typeof(v) = 'null';
      begin
        case c->>'type'
          when 'int64' then dummy := ((r.data->>(c->>'name'))::bigint)::text;
          when 'float64' then dummy := ((r.data->>(c->>'name'))::float8)::text;
          when 'timestamp' then dummy := ((r.data->>(c->>'name'))::timestamptz)::text;
          when 'date' then dummy := ((r.data->>(c->>'name'))::date)::text;
          else null;
        end case;
      exception when others then
        row_index := r.row_index; col := c->>'name'; typ := c->>'type';
        got := jsonb_typeof(v) || ' that does not convert (' || sqlerrm || ')';
        return next; return;
      end;
    end loop;
  end loop;
end $$;
