"""The settings are declared once, by section, and docs/configuration.md's tables are written from the declarations:
the page cannot name a variable nobody reads, nor miss one that is read, nor tell another default or bound.

Pure parsing and the environment of this process (monkeypatch): no database, no Dagster."""

from __future__ import annotations

import dataclasses
import re

import pytest

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.settings import Settings, declarations, mirror_freshness_seconds, sections
from lakehouse_dagster.core.settings_doc import BEGIN, COMMAND, END, rewritten
from lakehouse_dagster_tests.test_docs import (
    CONFIGURATION,
    SETTING_VARS,
    SETTINGS,
    read_directly,
    variables_read_in_settings,
)


@pytest.fixture
def settings(tmp_path, monkeypatch) -> Settings:
    """This process' environment cleared of the project's variables, then a few set as the suite's fixture sets them
    (no database: nothing here connects)."""
    for name in variables_read_in_settings():
        monkeypatch.delenv(name, raising=False)
    env = {
        "LAKEHOUSE_PG_DSN": "postgresql://nobody@127.0.0.1:9/none",
        "LAKEHOUSE_HOME": str(tmp_path / "home"),
        "LAKEHOUSE_ACTOR": "pytest",
        "LAKEHOUSE_SOAK_SECONDS": "0",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return Settings.from_env()


def _written_part(page: str) -> str:
    return page.split(BEGIN, 1)[1].split(END, 1)[0]


def test_the_configuration_page_is_what_the_declarations_write():
    page = CONFIGURATION.read_text()
    assert rewritten(page) == page, (
        f"docs/configuration.md's settings tables differ from the declarations in core/settings/; run `{COMMAND}` "
        "(a setting's meaning, default and bounds are edited in its declaration)"
    )


def test_the_check_sees_an_edit_by_hand():
    """If the comparison missed a changed default it would pass on anything."""
    page = CONFIGURATION.read_text()
    edited = page.replace("| `LAKEHOUSE_MIRROR_BATCH_SIZE` | `25` |", "| `LAKEHOUSE_MIRROR_BATCH_SIZE` | `50` |")
    assert edited != page and rewritten(edited) != edited


def test_every_variable_read_is_in_the_settings_tables_and_only_those():
    """The intent of the hand-written table's old test, kept: read ⇔ tabled, the standard ones (AWS_REGION) too."""
    written = _written_part(CONFIGURATION.read_text())
    tabled = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", "\n".join(re.findall(r"^\| ([^|]+) \|", written, re.M))))
    read = variables_read_in_settings()
    assert sorted(read - tabled) == [], "read in core/settings/, missing from the settings tables"
    assert sorted(tabled - read) == [], "in the settings tables, not read in core/settings/"
    assert {"LAKEHOUSE_PG_DSN", "LAKEHOUSE_HOME", "LAKEHOUSE_SOAK_SECONDS", "ENABLE_ICEBERG_SYNC", "AWS_REGION"} <= read
    assert len(read) >= 60, sorted(read)


def test_the_settings_read_the_environment_only_through_their_declarations():
    """A variable read by name beside the declarations would have no default, bound or meaning on the page."""
    modules = sorted(SETTINGS.glob("*.py"))
    assert modules and not any(read_directly(path) for path in modules) and read_directly(SETTING_VARS) == set()


def test_every_field_of_every_section_is_declared_once_with_a_meaning():
    envs = [var.env for _, _, var in declarations()]
    assert len(envs) == len(set(envs)), "a variable declared twice"
    for name, cls in sections().items():
        assert (cls.__doc__ or "").strip(), f"section {name} says nothing of itself"
        for field in dataclasses.fields(cls):
            var = field.metadata.get("var")
            assert var is not None or "given" in field.metadata, f"settings.{name}.{field.name} has no declaration"
            if var is not None:
                assert var.meaning.strip() and "\n" not in var.meaning and "|" not in var.meaning.replace("\\|", "")
                assert field.repr is not var.secret


def test_a_section_is_read_by_its_own_name_and_flat_names_say_where_they_went(settings):
    assert settings.postgres.dsn and settings.project.actor == "pytest" and settings.rollout.soak_seconds == 0
    assert settings.catalog.warehouse.endswith("/home/warehouse") and settings.catalog.type == "sql"
    assert settings.rollout.soak_seconds_given is True and settings.shadow.proof_reads_given is False
    with pytest.raises(AttributeError, match=r"read settings\.mirror\.batch_size"):
        settings.mirror_batch_size  # noqa: B018
    with pytest.raises(TypeError, match=r"read settings\.postgres\.dsn"):
        settings.replace(pg_dsn="x")
    quick = settings.replace(sync={"chunk_rows": 3}, parity={"digest_on_write": True})
    assert (quick.sync.chunk_rows, quick.parity.digest_on_write, quick.sync.max_concurrent) == (3, True, 4)
    assert settings.sync.chunk_rows == 250_000  # a copy: the settings themselves are frozen
    given = settings.with_vars({"LAKEHOUSE_MIRROR_BATCH_SIZE": 5, "LAKEHOUSE_NAMESPACE": "other"})
    assert (given.mirror.batch_size, given.catalog.namespace) == (5, "other")


@pytest.mark.parametrize(
    "variable, value, message",
    [
        (
            "LAKEHOUSE_MIRROR_BATCH_SIZE",
            "lots",
            "LAKEHOUSE_MIRROR_BATCH_SIZE='lots' is not an integer; set it to a whole number (default 25)",
        ),
        ("LAKEHOUSE_SHADOW_WORKERS", "0", "LAKEHOUSE_SHADOW_WORKERS=0 is below the minimum 1"),
        ("LAKEHOUSE_RETRY_FAILED_MAX", "-1", "LAKEHOUSE_RETRY_FAILED_MAX=-1 is below the minimum 0"),
        ("LAKEHOUSE_FLAG_TTL_SECONDS", "soon", "LAKEHOUSE_FLAG_TTL_SECONDS='soon' is not a number (default 10.0)"),
        ("LAKEHOUSE_API_TIMEOUT_SECONDS", "0", "LAKEHOUSE_API_TIMEOUT_SECONDS=0.0 must be above 0"),
        ("LAKEHOUSE_SHADOW_SAMPLE", "1.5", "LAKEHOUSE_SHADOW_SAMPLE=1.5 is not a fraction; set it from 0 (never)"),
        ("LAKEHOUSE_MIRROR_SYNC_SHARE", "0", "LAKEHOUSE_MIRROR_SYNC_SHARE=0.0 is not a share of the time"),
        ("LAKEHOUSE_FLAG_LISTEN", "maybe", "LAKEHOUSE_FLAG_LISTEN='maybe' is not a boolean; use true or false"),
        ("LAKEHOUSE_CATALOG_TYPE", "Hive", "LAKEHOUSE_CATALOG_TYPE='hive' is not supported; use sql or rest"),
        (
            "LAKEHOUSE_SNAPSHOTS_KEEP",
            "3",
            "LAKEHOUSE_SNAPSHOTS_KEEP=3 is below 16, the snapshots compaction reads to decide; set it to 0 (never "
            "expire) or 16 or more",
        ),
        (
            "LAKEHOUSE_CATALOG_PROPERTIES",
            "[1]",
            'LAKEHOUSE_CATALOG_PROPERTIES is not a JSON object of strings; set it like {"scope": "PRINCIPAL_ROLE:ALL"}',
        ),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_the_variable(settings, monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    with pytest.raises(BadInput) as caught:
        Settings.from_env()
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_rest_catalog_without_its_url_is_refused(settings, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_CATALOG_TYPE", "rest")
    monkeypatch.delenv("LAKEHOUSE_CATALOG_URI", raising=False)
    with pytest.raises(BadInput, match=r"LAKEHOUSE_CATALOG_TYPE=rest needs LAKEHOUSE_CATALOG_URI"):
        Settings.from_env()


def test_the_freshness_window_is_read_alone(settings, monkeypatch):
    """The code location builds the freshness policy when it loads: another variable's bad value must not stop it."""
    monkeypatch.setenv("LAKEHOUSE_SHADOW_WORKERS", "none")
    monkeypatch.setenv("LAKEHOUSE_MIRROR_FRESHNESS_SECONDS", "120")
    assert mirror_freshness_seconds() == 120
    monkeypatch.setenv("LAKEHOUSE_MIRROR_FRESHNESS_SECONDS", "30")
    with pytest.raises(BadInput, match=r"=30 is below 60 \(Dagster's freshness windows are at least a minute\)"):
        mirror_freshness_seconds()


def test_the_secrets_never_show_in_a_repr(settings, monkeypatch):
    secrets = {
        "LAKEHOUSE_API_TOKEN": "tok-0123456789abcdef",
        "LAKEHOUSE_ALERT_WEBHOOK_URL": "https://hooks.example/T0/B0/secretpath",
        "LAKEHOUSE_CATALOG_CREDENTIAL": "client:s3cr3t",
        "LAKEHOUSE_CATALOG_TOKEN": "bearer-s3cr3t",
    }
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    read = Settings.from_env()
    assert read.service.token == secrets["LAKEHOUSE_API_TOKEN"] and read.catalog.token == "bearer-s3cr3t"
    shown = repr(read)
    assert not [k for k, v in secrets.items() if v in shown]


def test_the_region_falls_back_to_aws_default_region(settings, monkeypatch):
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    assert Settings.from_env().s3.region == "eu-west-3"
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert Settings.from_env().s3.region == "us-west-2"
