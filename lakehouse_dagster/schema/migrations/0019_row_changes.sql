
create table if not exists lakehouse_row_changes (
  dataset_id uuid not null,
  version bigint not null,          -- the statement's rows_version (= its rows_rewrite_version)
  bucket bigint not null,           -- row_index >> 12
  prev_version bigint not null,     -- the dataset's rows_rewrite_version before the statement
  min_idx bigint not null,
  max_idx bigint not null,
  primary key (dataset_id, version, bucket)
);
