"""The settings of where things are: the project's home and actor, Postgres, the Iceberg catalog, the S3 store."""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
from pathlib import Path

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.setting_vars import (
    ABOVE_ZERO,
    at_least,
    one_of,
    read_one,
    setting,
)


def _home_default() -> Path:
    return (Path.cwd() / ".lakehouse").resolve()


def _warehouse_default() -> str:
    return (read_one(ProjectSettings, "home") / "warehouse").as_uri()


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return f"uid:{os.getuid()}"


def _catalog_properties(name: str, raw: str) -> dict[str, str]:
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadInput(f'{name} is not a JSON object of strings; set it like {{"scope": "PRINCIPAL_ROLE:ALL"}}')
    return value


@dataclasses.dataclass(frozen=True)
class ProjectSettings:
    """Where the project keeps its local state, and who acts: the home and the actor audited."""

    home: Path = setting(
        "LAKEHOUSE_HOME",
        None,
        "embedded Postgres, local warehouse, `DAGSTER_HOME`, the demo's source files",
        kind="path",
        factory=_home_default,
        shown="`./.lakehouse`",
    )
    actor: str = setting(
        "LAKEHOUSE_ACTOR",
        None,
        "who a flag change is audited as",
        factory=_os_user,
        shown="OS user",
    )


@dataclasses.dataclass(frozen=True)
class PostgresSettings:
    """The project's Postgres: the app tables, the control tables and (by default) the Iceberg SQL catalog."""

    dsn: str | None = setting(
        "LAKEHOUSE_PG_DSN",
        None,
        (
            "Postgres with the app tables, control tables and the Iceberg SQL catalog; unset: the embedded server"
            " under `$LAKEHOUSE_HOME/pg` (started only by `lakehouse up` / `lakehouse pg start`; any other verb "
            "attaches to it running, or refuses in one line, exit 3)"
        ),
        shown="embedded server",
    )


@dataclasses.dataclass(frozen=True)
class CatalogSettings:
    """The Iceberg catalog and its warehouse (lake/catalog.py); a REST catalog's secrets come from the environment only."""

    type: str = setting(
        "LAKEHOUSE_CATALOG_TYPE",
        "sql",
        "`sql` (pyiceberg SqlCatalog on `LAKEHOUSE_PG_DSN`) or `rest`",
        kind="lower",
        bound=one_of("sql", "rest"),
    )
    uri: str | None = setting(
        "LAKEHOUSE_CATALOG_URI",
        None,
        (
            "the REST catalog URL (required with `rest`; also what `lakehouse catalog migrate` moves tables to or"
            " from) ([REST catalog](rest-catalog.md))"
        ),
    )
    credential: str | None = setting(
        "LAKEHOUSE_CATALOG_CREDENTIAL",
        None,
        (
            "a REST catalog's OAuth2 client credential `id:secret` (SeaweedFS: its S3 access key and secret); a "
            "secret: read from the environment only, never a resource field, never logged or written to a table"
        ),
        secret=True,
    )
    token: str | None = setting(
        "LAKEHOUSE_CATALOG_TOKEN",
        None,
        "a REST catalog's bearer token instead of a credential (a secret, as above)",
        secret=True,
    )
    properties: dict[str, str] = setting(
        "LAKEHOUSE_CATALOG_PROPERTIES",
        None,
        (
            'more RestCatalog properties, a JSON object of strings, e.g. `{"scope": "PRINCIPAL_ROLE:ALL"}` '
            '(Polaris) or `{"header.X-Iceberg-Access-Delegation": "vended-credentials"}`; they win over the '
            "project's own. Not for secrets"
        ),
        parse=_catalog_properties,
        factory=dict,
        shown="—",
    )
    warehouse: str = setting(
        "LAKEHOUSE_WAREHOUSE",
        None,
        (
            "where table files go; `s3://bucket/prefix` with the standard AWS variables (credentials from the "
            "SDK's default chain; `AWS_REGION`/`AWS_DEFAULT_REGION` the region, else `us-east-1` with "
            "`LAKEHOUSE_S3_ENDPOINT`) and, for a store that is not AWS, `LAKEHOUSE_S3_ENDPOINT` ([object store "
            "faults](design/faults.md#object-store-faults))"
        ),
        factory=_warehouse_default,
        shown="`file://$LAKEHOUSE_HOME/warehouse`",
    )
    namespace: str = setting(
        "LAKEHOUSE_NAMESPACE",
        "lakehouse",
        "Iceberg namespace; tables are `<namespace>.ds_<uuid hex>`",
    )


@dataclasses.dataclass(frozen=True)
class S3Settings:
    """An S3-compatible object store: the warehouse's and the s3:// file sources' (lake/storage.py)."""

    endpoint: str | None = setting(
        "LAKEHOUSE_S3_ENDPOINT",
        None,
        (
            "endpoint of an S3-compatible store (MinIO, moto) for `s3://` file sources and an `s3://` warehouse "
            "(the catalog's FileIO, `s3.endpoint`); the standard AWS variables give the credentials and region"
        ),
    )
    region: str | None = setting(
        "AWS_REGION",
        None,
        (
            "the region of an `s3://` warehouse (the catalog's FileIO, `s3.region`; given, pyiceberg does not ask"
            " AWS for the bucket's); unset: the SDK's, or `us-east-1` with `LAKEHOUSE_S3_ENDPOINT`"
        ),
        also=("AWS_DEFAULT_REGION",),
    )
    connect_timeout_seconds: float = setting(
        "LAKEHOUSE_S3_CONNECT_TIMEOUT_SECONDS",
        5.0,
        (
            "an `s3://` warehouse: a connect to the store that takes longer fails and is retried (pyiceberg's "
            "`s3.connect-timeout`)"
        ),
        bound=ABOVE_ZERO,
    )
    request_timeout_seconds: float = setting(
        "LAKEHOUSE_S3_REQUEST_TIMEOUT_SECONDS",
        10.0,
        (
            "an `s3://` warehouse: a request during which nothing arrives for this long fails and is retried "
            "(`s3.request-timeout`, curl's low-speed limit: a store that trickles a byte now and then is not cut)."
            " Each request is tried 9 times at most (8 retries, 6.4 s of backoff in all), so a silent "
            "store fails a sync after about 9 × this + 6.4 s, exit 75"
        ),
        bound=ABOVE_ZERO,
    )
    max_retries: int = setting(
        "LAKEHOUSE_S3_MAX_RETRIES",
        8,
        (
            "an `s3://` warehouse: retries of one failed request (the SDK's default strategy, backoff from 25 ms "
            "doubling: 8 retries wait 6.4 s in all, `lake/storage.py` says why 8). Fewer only where waiting out the "
            "backoff is not the point, e.g. the suite's tests of a store failing everything"
        ),
        bound=at_least(0),
    )
