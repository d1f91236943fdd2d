"""The Iceberg catalog: pyiceberg SqlCatalog on the project's Postgres by default, REST by configuration.

G1 (catalog commits serialised) is the catalog's own on both: the SqlCatalog's compare-and-swap on the metadata
location in Postgres, a REST catalog's check of each commit's requirements on its server (a stale commit gets 409,
CommitFailedException, as a lost swap does). Either holds across processes and machines without an in-process
lock; G4, the retry of a lost commit, is the writer's (lake/writer.py). Nothing else of the project reads the
catalog's storage: everything goes through pyiceberg's Catalog API, so a table behaves alike on both.

A REST catalog's secrets come from the environment (Settings.catalog_credential / catalog_token) and go to
pyiceberg's RestCatalog only: never to a table property, a log line or a run's config.
"""

from __future__ import annotations

import threading
import uuid

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError
from pyiceberg.table import Table

from lakehouse_dagster.core.db import connect, sqlalchemy_url
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.storage import file_io_properties

_cache: dict[tuple, Catalog] = {}
_cache_lock = threading.Lock()


def load_catalog(settings: Settings, dsn: str) -> Catalog:
    """One catalog object per (type, uri, warehouse, FileIO properties) in a process: SqlCatalog holds an engine pool."""
    key = (
        settings.catalog.type,
        settings.catalog.uri or dsn,
        settings.catalog.warehouse,
        tuple(sorted(file_io_properties(settings.s3).items())),
        settings.catalog.credential,
        settings.catalog.token,
        tuple(sorted(settings.catalog.properties.items())),
    )
    with _cache_lock:
        cat = _cache.get(key)
        if cat is None:
            cat = _build(settings, dsn)
            _cache[key] = cat
        return cat


def _build(settings: Settings, dsn: str) -> Catalog:
    if settings.catalog.type == "rest":
        from pyiceberg.catalog.rest import RestCatalog  # lazy: only a REST catalog needs it

        return RestCatalog("lakehouse", **rest_properties(settings))
    # lazy: pyiceberg's SQL catalog pulls SQLAlchemy in; the CLI's light commands never open a catalog
    from pyiceberg.catalog.sql import SqlCatalog  # lazy: see above

    # SqlCatalog creates its tables on first use with CREATE TABLE IF NOT EXISTS, which two processes
    # starting together both run: the loser fails on a unique index (found by `lakehouse ingest-bench`).
    # One advisory lock serialises the creation across processes; afterwards it is a quick no-op.
    with connect(dsn) as conn:
        conn.execute("select pg_advisory_lock(hashtextextended('lakehouse_sql_catalog_init', 0))")
        try:
            catalog = SqlCatalog(
                "lakehouse",
                uri=sqlalchemy_url(dsn),
                warehouse=settings.catalog.warehouse,
                # Keep connections few: every Dagster run process gets its own pool.
                pool_pre_ping="true",
                **file_io_properties(settings.s3),  # an s3:// warehouse: endpoint, region, timers, retries
            )
            _failed_pings_reconnect(catalog.engine)
            return catalog
        finally:
            conn.execute("select pg_advisory_unlock(hashtextextended('lakehouse_sql_catalog_init', 0))")


def _failed_pings_reconnect(engine) -> None:
    """A pooled connection whose pre-ping fails is replaced, whatever the error. SQLAlchemy's psycopg ping turns
    autocommit on, pings, and turns it off again in a ``finally``: on a connection reset in the middle of the
    ping, that last step raises "can't change 'autocommit' now: connection in transaction status ACTIVE", which
    hides the disconnect, so the pool raised it instead of reconnecting (a commit after a network reset then
    failed as "outcome unknown": the CI flake of test_infra_faults' reset inside the commit)."""
    from sqlalchemy import event  # lazy: only a SQL catalog needs it

    def on_error(context) -> None:
        if context.is_pre_ping:
            context.is_disconnect = True

    event.listen(engine, "handle_error", on_error)


def rest_properties(settings: Settings) -> dict[str, str]:
    """The RestCatalog's properties: its URL and warehouse, the FileIO's (lake/storage.py), the secrets from the
    environment, then LAKEHOUSE_CATALOG_PROPERTIES (a scope, an access-delegation header...), which win."""
    if not settings.catalog.uri:  # Settings.replace (the Dagster resource's config) skips from_env's check
        raise BadInput("catalog_type rest needs a catalog URI (LAKEHOUSE_CATALOG_URI: the REST catalog's URL)")
    props = {"uri": settings.catalog.uri, "warehouse": settings.catalog.warehouse, **file_io_properties(settings.s3)}
    if settings.catalog.credential:
        props["credential"] = settings.catalog.credential
        # The token endpoint the REST spec names; unset, pyiceberg guesses it and warns that the guess will go.
        props["oauth2-server-uri"] = settings.catalog.uri.rstrip("/") + "/v1/oauth/tokens"
    if settings.catalog.token:
        props["token"] = settings.catalog.token
    return {**props, **settings.catalog.properties}


def table_identifier(settings: Settings, dataset_id: uuid.UUID) -> tuple[str, str]:
    return (settings.catalog.namespace, f"ds_{dataset_id.hex}")


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    """Create the namespace unless it exists. Concurrent writers race here on their first write: the
    SqlCatalog's check-then-insert lets the loser fail on the primary key (an IntegrityError, not
    NamespaceAlreadyExistsError — found by `lakehouse ingest-bench`), which is fine once it exists."""
    from sqlalchemy.exc import IntegrityError  # lazy: with the SQL catalog above

    try:
        catalog.create_namespace_if_not_exists(namespace)
    except (NamespaceAlreadyExistsError, IntegrityError):  # lost a race with another process
        if not catalog.namespace_exists(namespace):
            raise


def load_table_or_none(catalog: Catalog, identifier: tuple[str, str]) -> Table | None:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None
