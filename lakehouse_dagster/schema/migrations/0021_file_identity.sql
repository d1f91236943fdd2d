
create table if not exists lakehouse_file_identity (
  dataset_id uuid not null,
  file_path text not null,
  file_size bigint not null,
  fields_key text not null,
  row_count bigint not null,
  row_index_nonnull bigint not null,
  row_id_nonnull bigint not null,
  created_at_nonnull bigint not null,
  distinct_row_index bigint not null,
  min_row_index bigint,
  max_row_index bigint,
  computed_at timestamptz not null default now(),
  primary key (dataset_id, file_path, file_size, fields_key)
);
