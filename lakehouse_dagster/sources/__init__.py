"""Dataset sources (files, postgres, cdc) for the source writers; no dagster import.

The names below load on first use (PEP 562): importing sources.spec (the CLI's parser) does not import pyarrow."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.sources.spec import SourceSpec, parse_source
    from lakehouse_dagster.sources.stored import get_source, set_source

_HOME = {"SourceSpec": "spec", "parse_source": "spec", "get_source": "stored", "set_source": "stored"}

__all__ = ["SourceSpec", "get_source", "parse_source", "set_source"]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
