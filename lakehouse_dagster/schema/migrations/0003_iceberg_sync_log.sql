
create table if not exists iceberg_sync_log (
  id bigserial primary key,
  dataset_id uuid not null,
  sync_id uuid not null unique,
  writer text not null default 'sync.full',
  path text not null default 'mirror' check (path in ('mirror', 'native')),
  mode text,
  status text not null check (status in ('running', 'succeeded', 'failed')),
  rows bigint,
  bytes bigint,
  snapshot_id bigint,
  has_identity boolean not null default false,
  source_version bigint,
  max_row_index bigint,
  run_id text,
  error text,
  started_at timestamptz not null default now(),
  finished_at timestamptz
);
create index if not exists iceberg_sync_log_dataset_idx on iceberg_sync_log (dataset_id, finished_at desc nulls last);
create index if not exists iceberg_sync_log_running_idx on iceberg_sync_log (status) where status = 'running';

create or replace function lakehouse_bad_value(ds uuid, ri bigint, col text, typ text, got text)
returns text language plpgsql as $$
begin
  raise exception using errcode = '22023',
    message = format('dataset %s row_index %s column %s: expected %s, got a JSON %s', ds, ri, col, typ, got);
end $$;

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
