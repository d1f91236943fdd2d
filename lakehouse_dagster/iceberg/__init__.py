"""Iceberg: catalog, schema mapping with identity columns, the chunked writer, the reader."""
