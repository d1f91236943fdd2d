"""DAGSTER_PG_URL in the plain ``postgresql://`` form Dagster's docs use works with the repository's dagster.yaml
(and deploy/dagster.yaml): a run's events are stored. Before lakehouse_dagster/dagster/storage.py, SQLAlchemy 2.1
opened such a URL with psycopg 3 and dagster-postgres' ``NOTIFY run_events, $1`` failed on every event."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from lakehouse_dagster.cli.dsn import conninfo_to_url
from lakehouse_dagster.dagster.storage import psycopg2_url
from lakehouse_dagster.testing.pg import with_db

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bare_dagster_url(pg_admin_dsn):
    """A fresh database for Dagster's storage, as a bare ``postgresql://`` URL (no driver named)."""
    name = f"dg_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    url = conninfo_to_url(with_db(pg_admin_dsn, name))
    assert url.startswith("postgresql://")
    yield url, with_db(pg_admin_dsn, name)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


@pytest.mark.parametrize("yaml_file", ["dagster.yaml", "deploy/dagster.yaml"])
def test_a_bare_postgresql_url_stores_a_runs_events(yaml_file, bare_dagster_url, tmp_path, monkeypatch):
    import dagster as dg

    if not (ROOT / yaml_file).exists():
        pytest.skip(f"{yaml_file} does not exist yet")
    url, db_dsn = bare_dagster_url
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(ROOT / yaml_file, home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_PG_URL", url)

    @dg.op
    def hello(context) -> int:
        context.log.info("hello from a run on a bare postgresql:// URL")
        return 1

    @dg.job
    def probe_job():
        hello()

    with dg.DagsterInstance.from_config(str(home)) as inst:
        assert type(inst.event_log_storage).__name__ == "PostgresEventLogStorage"
        result = probe_job.execute_in_process(instance=inst)
        assert result.success
        events = inst.all_logs(result.run_id)
        types = {e.dagster_event.event_type for e in events if e.dagster_event is not None}
        kinds = dg.DagsterEventType
        assert {kinds.RUN_START, kinds.STEP_START, kinds.STEP_SUCCESS, kinds.RUN_SUCCESS} <= types
        assert any("hello from a run" in e.user_message for e in events)
        assert inst.get_run_by_id(result.run_id).status == dg.DagsterRunStatus.SUCCESS
    with psycopg.connect(db_dsn) as c:  # stored in Postgres, on the server the URL names
        assert c.execute("select count(*) from event_logs where run_id = %s", (result.run_id,)).fetchone()[0] >= 4


def test_psycopg2_url_names_the_driver_only_where_sqlalchemy_would_pick_psycopg3():
    assert psycopg2_url("postgresql://u:p@h:5432/db") == "postgresql+psycopg2://u:p@h:5432/db"
    assert psycopg2_url("postgres://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert psycopg2_url("postgresql+psycopg://u@/db?host=/tmp/s") == "postgresql+psycopg2://u@/db?host=/tmp/s"
    assert psycopg2_url("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert psycopg2_url("postgresql+pg8000://u@h/db") == "postgresql+pg8000://u@h/db"  # chosen on purpose: kept
    # the password and the rest of the URL are left alone, even where they spell a scheme
    assert psycopg2_url("postgresql://u:postgresql%3A%2F%2F@h/db") == "postgresql+psycopg2://u:postgresql%3A%2F%2F@h/db"
