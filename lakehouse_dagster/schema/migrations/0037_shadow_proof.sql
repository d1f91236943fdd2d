-- Shadow reads of structured requests (issue 43, routing/shadow.py) and the proof a flip of a compute reader asks
-- for (flags/proof.py): the request a comparison ran (null: a projection read) and the digest of the dataset's
-- schema it ran against (md5 of datasets.schema, read with the version check), so that only the comparisons since
-- the dataset's last change of schema count.
alter table lakehouse_shadow_reads add column if not exists query jsonb;
alter table lakehouse_shadow_reads add column if not exists schema_digest text;
create index if not exists lakehouse_shadow_reads_proof_idx on lakehouse_shadow_reads (reader, dataset_id, id);
