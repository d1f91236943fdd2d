"""SQL functions of the mirror's typed read (migration "003_iceberg_sync_log"): a value that does not fit the
dataset's schema is named by row and column instead of failing as a bare cast error."""

# Raises; declared to return text so it can sit in the ELSE branch of any typed CASE (the cast that
# follows it is planned but never evaluated).
BAD_VALUE_FN = """
create or replace function lakehouse_bad_value(ds uuid, ri bigint, col text, typ text, got text)
returns text language plpgsql as $$
begin
  raise exception using errcode = '22023',
    message = format('dataset %s row_index %s column %s: expected %s, got a JSON %s', ds, ri, col, typ, got);
end $$;
"""

# Finds the first row whose value fails to cast (a number that is not an integer, a date that does not
# parse...): slow, and only run after the fast query failed, to turn a bare cast error into one that
# names the row.
FIND_BAD_ROW_FN = """
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
"""
