"""SeaweedFS for the tests and benches: the runtime's starter (lake/seaweed.py), on a temporary directory with
made-up credentials (``SeaweedServer()``), so the tests start the server exactly as ``lakehouse up`` does."""

from lakehouse_dagster.lake.seaweed import TABLE_BUCKET, SeaweedServer, weed_binary

__all__ = ["TABLE_BUCKET", "SeaweedServer", "weed_binary"]
