"""The Iceberg lakehouse: catalog, schema mapping with identity columns, the chunked writer, the reader, orphans.
No app tables, no parity: callers hand it rows and get back what it wrote."""
