"""Read and write flags: the registry (registry.py), runtime overrides + audit (overrides.py),
precedence and clamp coded once (precedence.py), the TTL-cached resolver (resolver.py) and which
datasets are native (native.py); the reverse mirror's on/off setting (reverse_setting.py).

Plain functions over explicit arguments; never imports dagster. The names below load on first use (PEP 562), so
importing one light module of the package (the registry, for the CLI's parser) does not import psycopg.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.flags.native import native_dataset_ids
    from lakehouse_dagster.flags.overrides import clear_override, history, list_overrides, set_override
    from lakehouse_dagster.flags.registry import READ, READERS, WRITE, WRITERS, get_flag
    from lakehouse_dagster.flags.resolver import FlagResolver, Resolution, invalidate_local

_HOME = {
    "native_dataset_ids": "native",
    "clear_override": "overrides",
    "history": "overrides",
    "list_overrides": "overrides",
    "set_override": "overrides",
    "READ": "registry",
    "READERS": "registry",
    "WRITE": "registry",
    "WRITERS": "registry",
    "get_flag": "registry",
    "FlagResolver": "resolver",
    "Resolution": "resolver",
    "invalidate_local": "resolver",
}

__all__ = [
    "READ",
    "WRITE",
    "READERS",
    "WRITERS",
    "get_flag",
    "FlagResolver",
    "Resolution",
    "invalidate_local",
    "set_override",
    "clear_override",
    "list_overrides",
    "history",
    "native_dataset_ids",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
