"""The Iceberg catalog: pyiceberg SqlCatalog on the project's Postgres by default, REST by configuration.

SqlCatalog commits are a compare-and-swap on the metadata location (G1 holds across processes and
machines without an in-process lock); pyiceberg retries a lost swap itself (G4).
"""

from __future__ import annotations

import threading
import uuid

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError
from pyiceberg.table import Table

from ..settings import Settings
from ..store.db import sqlalchemy_url

_cache: dict[tuple, Catalog] = {}
_cache_lock = threading.Lock()


def load_catalog(settings: Settings, dsn: str) -> Catalog:
    """One catalog object per (type, uri, warehouse) in a process: SqlCatalog holds an engine pool."""
    key = (settings.catalog_type, settings.catalog_uri or dsn, settings.warehouse)
    with _cache_lock:
        cat = _cache.get(key)
        if cat is None:
            cat = _build(settings, dsn)
            _cache[key] = cat
        return cat


def _build(settings: Settings, dsn: str) -> Catalog:
    if settings.catalog_type == "rest":
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog("lakehouse", uri=settings.catalog_uri, warehouse=settings.warehouse)
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(
        "lakehouse",
        uri=sqlalchemy_url(dsn),
        warehouse=settings.warehouse,
        # Keep connections few: every Dagster run process gets its own pool.
        pool_pre_ping="true",
    )


def table_identifier(settings: Settings, dataset_id: uuid.UUID) -> tuple[str, str]:
    return (settings.namespace, f"ds_{dataset_id.hex}")


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except NamespaceAlreadyExistsError:  # lost a race with another process: fine
        pass


def load_table_or_none(catalog: Catalog, identifier: tuple[str, str]) -> Table | None:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None
