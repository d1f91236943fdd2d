"""lakehouse_dagster: Postgres row store → Apache Iceberg lakehouse, run as Dagster jobs."""
