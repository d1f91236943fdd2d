"""The asset keys of the code location, defined once (assets, checks, sensors and recorded events name them)."""

import dagster as dg

PG_ROWS = dg.AssetKey(["postgres", "dataset_rows"])  # a dataset's rows in Postgres, one partition per dataset
ICEBERG_TABLE = dg.AssetKey(["iceberg", "dataset_table"])  # its Iceberg table, same partitions
MIGRATION_OVERVIEW = dg.AssetKey(["lakehouse", "migration_overview"])  # the whole migration, unpartitioned
