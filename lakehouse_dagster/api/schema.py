"""The project's own schema, the face `lakehouse migrate`, `lakehouse db` and `lakehouse up` import: the
numbered migrations, which are applied, and applying them (schema/migrate.py).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.schema.migrate import applied_migrations, load_migrations, migrate

_HOME = {
    "applied_migrations": "lakehouse_dagster.schema.migrate",
    "load_migrations": "lakehouse_dagster.schema.migrate",
    "migrate": "lakehouse_dagster.schema.migrate",
}

__all__ = [
    "applied_migrations",
    "load_migrations",
    "migrate",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
