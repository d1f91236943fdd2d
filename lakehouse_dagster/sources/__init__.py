"""Dataset sources (files, postgres, cdc) for the source writers; no dagster import."""

from lakehouse_dagster.sources.spec import SourceSpec, parse_source
from lakehouse_dagster.sources.stored import get_source, set_source

__all__ = ["SourceSpec", "get_source", "parse_source", "set_source"]
