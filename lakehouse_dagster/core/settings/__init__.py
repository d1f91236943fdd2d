"""Every environment variable the project reads, typed, in one package: each declared once, in its section
(``storage.py`` where things are, ``mirroring.py`` moving rows, ``operations.py`` operating the migration).

A section is the settings of one capability (``settings.mirror``, ``settings.service``...); a capability reads its
own. Each field is declared with ``setting(variable, default, meaning, bound=...)`` (core/setting_vars.py):
``Settings.from_env`` reads them all, refusing a bad value in one line that names the variable, and
docs/configuration.md's tables are written from the same declarations (``python -m
lakehouse_dagster.core.settings_doc --write``; lakehouse_dagster_tests/test_settings_doc.py fails when they differ).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.setting_vars import Var, declared, read_one, read_section
from lakehouse_dagster.core.settings.mirroring import (
    SNAPSHOTS_KEEP_MIN,
    MaintenanceSettings,
    MirrorSettings,
    ReverseSettings,
    StreamSettings,
    SyncSettings,
)
from lakehouse_dagster.core.settings.operations import (
    AlertSettings,
    CompleteSettings,
    FlagSettings,
    ParitySettings,
    RecorderSettings,
    RolloutSettings,
    ServiceSettings,
    ShadowSettings,
)
from lakehouse_dagster.core.settings.storage import CatalogSettings, PostgresSettings, ProjectSettings, S3Settings

__all__ = [
    "SNAPSHOTS_KEEP_MIN",
    "Settings",
    "declarations",
    "mirror_freshness_seconds",
    "sections",
    "variables",
    # the sections, for a function that reads one (``plan_shards(stream: StreamSettings, ...)``)
    "AlertSettings",
    "CatalogSettings",
    "CompleteSettings",
    "FlagSettings",
    "MaintenanceSettings",
    "MirrorSettings",
    "ParitySettings",
    "PostgresSettings",
    "ProjectSettings",
    "RecorderSettings",
    "ReverseSettings",
    "RolloutSettings",
    "S3Settings",
    "ServiceSettings",
    "ShadowSettings",
    "StreamSettings",
    "SyncSettings",
]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting, by section (``settings.mirror.batch_size``); built once per process by ``from_env``."""

    project: ProjectSettings
    postgres: PostgresSettings
    catalog: CatalogSettings
    s3: S3Settings
    sync: SyncSettings
    maintenance: MaintenanceSettings
    mirror: MirrorSettings
    stream: StreamSettings
    reverse: ReverseSettings
    flags: FlagSettings
    rollout: RolloutSettings
    shadow: ShadowSettings
    parity: ParitySettings
    complete: CompleteSettings
    service: ServiceSettings
    alerts: AlertSettings
    recorder: RecorderSettings

    @classmethod
    def from_env(cls) -> Settings:
        """Every section read from the environment, each variable in its declaration."""
        settings = cls(**{name: read_section(section) for name, section in sections().items()})
        if settings.catalog.type == "rest" and not settings.catalog.uri:
            raise BadInput("LAKEHOUSE_CATALOG_TYPE=rest needs LAKEHOUSE_CATALOG_URI (the REST catalog's URL)")
        return settings

    def replace(self, **changes: Any) -> Settings:
        """A copy with some sections changed: each a section, or a mapping of the fields to change in it
        (``settings.replace(sync={"chunk_rows": 3})``)."""
        known = sections()
        for name in changes:
            if name not in known:
                raise TypeError(f"Settings has no section {name!r}{_moved(name)}")
        return dataclasses.replace(
            self,
            **{
                name: dataclasses.replace(getattr(self, name), **value) if isinstance(value, Mapping) else value
                for name, value in changes.items()
            },
        )

    def with_vars(self, values: Mapping[str, Any]) -> Settings:
        """A copy with the settings of these variables (``{"LAKEHOUSE_MIRROR_BATCH_SIZE": 5}``) set, as given."""
        index = variables()
        changes: dict[str, dict[str, Any]] = {}
        for env, value in values.items():
            section, field = index[env]
            changes.setdefault(section, {})[field] = value
        return self.replace(**changes)

    if not typing.TYPE_CHECKING:

        def __getattr__(self, name: str):
            """A flat name of before the sections (``settings.mirror_batch_size``) says where it went."""
            raise AttributeError(f"Settings has no attribute {name!r}{_moved(name)}")


def sections() -> dict[str, type]:
    """Section attribute -> its class, in the order the docs show them."""
    return {name: hint for name, hint in typing.get_type_hints(Settings).items()}


def variables() -> dict[str, tuple[str, str]]:
    """Every declared variable -> (section, field)."""
    return {var.env: (name, field) for name, cls in sections().items() for field, var in declared(cls)}


def declarations() -> list[tuple[str, str, Var]]:
    """(section, field, declaration) of every variable, in the docs' order."""
    return [(name, field, var) for name, cls in sections().items() for field, var in declared(cls)]


def _moved(name: str) -> str:
    """Where a flat name of before the sections went (named after its variable): a hint for old code."""
    env = "ENABLE_ICEBERG_SYNC" if name == "enable_iceberg_sync" else f"LAKEHOUSE_{name.upper()}"
    where = variables().get(env) or variables().get(f"LAKEHOUSE_{name.upper().removesuffix('_GIVEN')}")
    if name == "s3_region":
        where = ("s3", "region")
    if where is None:
        return ""
    suffix = "_given" if name.endswith("_given") else ""
    return f": the settings are by section, read settings.{where[0]}.{where[1]}{suffix}"


def mirror_freshness_seconds() -> int:
    """LAKEHOUSE_MIRROR_FRESHNESS_SECONDS alone: the Iceberg asset's freshness policy is built when the code location
    loads, and a bad value elsewhere must not stop it from loading."""
    value: int = read_one(MirrorSettings, "freshness_seconds")
    return value
