"""Steps 3 and 4 of `lakehouse up`: Dagster's storage (its own database, or the URL given), DAGSTER_HOME with the
project's dagster.yaml, the service's bearer token, the soak every process reads.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import psycopg
from psycopg import sql

from lakehouse_dagster.cli.dsn import conninfo_to_url, dagster_url, display_dsn
from lakehouse_dagster.cli.up.shared import _connect, _first_line, _say
from lakehouse_dagster.core.errors import LakehouseError

PROJECT_ROOT = Path(__file__).resolve().parents[3]  # the checkout: lakehouse_dagster/cli/up/ is three below it


DAGSTER_DB = "dagster"
# The environment variable dagster.yaml reads its storage URL from.
DAGSTER_URL_ENV = "DAGSTER_PG_URL"


def ensure_dagster_database(conn: psycopg.Connection, dsn: str) -> str:
    """A database ``dagster`` on the server ``conn`` talks to (created if missing); its URL."""
    exists = conn.execute("select 1 from pg_database where datname = %s", (DAGSTER_DB,)).fetchone()
    if not exists:
        try:
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(DAGSTER_DB)))
        except psycopg.errors.DuplicateDatabase:  # created concurrently: fine
            pass
        except psycopg.Error as exc:
            raise LakehouseError(
                f"cannot create the database {DAGSTER_DB!r} for Dagster's storage on {display_dsn(dsn)} "
                f"({_first_line(exc)}); set {DAGSTER_URL_ENV} to a Postgres database Dagster may use"
            ) from None
    return dagster_url(dsn, DAGSTER_DB)


def dagster_storage_url(conn: psycopg.Connection, dsn: str) -> tuple[str, str]:
    """(url, where it came from) for dagster.yaml's storage."""
    for name in (DAGSTER_URL_ENV, "LAKEHOUSE_DAGSTER_PG_DSN"):
        given = os.environ.get(name)
        if given:
            _connect(conninfo_to_url(given, what=name)).close()  # fail now, in one line, not in three processes
            return dagster_url(given, what=name), name
    return ensure_dagster_database(conn, dsn), f"database {DAGSTER_DB!r} on the same server"


def project_file(name: str) -> Path:
    path = PROJECT_ROOT / name
    if not path.is_file():
        raise LakehouseError(
            f"{name} not found at {path}; lakehouse up runs from a source checkout (use scripts/start there)"
        )
    return path


def prepare_dagster_home(home: Path) -> Path:
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(project_file("dagster.yaml"), dagster_home / "dagster.yaml")
    return dagster_home


API_TOKEN_FILE = "api-token"


def api_token(home: Path, from_env: str | None) -> tuple[str, Path | None]:
    """The service's bearer token: LAKEHOUSE_API_TOKEN when set (no file), else the one kept in
    ``home/api-token``, made once (32 random bytes, URL-safe) with owner-only permissions; a kept file that
    others can read is narrowed to the owner. Never printed: only where it is."""
    if from_env:
        return from_env, None
    path = home / API_TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
            _say(f"{path} was readable by others: now owner-only")
        token = path.read_text().strip()
        if len(token) >= 16:
            return token, path
        raise LakehouseError(
            f"{path} holds no usable token (under 16 characters); delete it to make a new one"
        ) from None
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, path


def _seed_soak(conn: psycopg.Connection, settings, *, demo: bool) -> None:
    """Store the soak once, so every process of this stack (the CLI, the webserver, the daemon, each run) applies one
    value (flags/soak_setting.py): LAKEHOUSE_SOAK_SECONDS when set, else 0 for the demo on the embedded Postgres
    (the walkthrough widens at once), else the default hour. A stored soak is left as it is."""
    from lakehouse_dagster.api.flags import (
        current_soak,
        seed_soak,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    if settings.rollout.soak_seconds_given or not demo:
        seconds, why = (
            settings.rollout.soak_seconds,
            (
                "LAKEHOUSE_SOAK_SECONDS"
                if settings.rollout.soak_seconds_given
                else "the default; LAKEHOUSE_SOAK_SECONDS is not set"
            ),
        )
    else:
        seconds, why = 0, "lowered for the demo: flips widen without waiting, still in the runbooks' order"
    seeded = seed_soak(conn, seconds, note=f"lakehouse up: {why}", actor=f"{settings.project.actor} (lakehouse up)")
    if seeded is None:
        _say(f"soak: {current_soak(conn, settings).describe()}")
        return
    _say(
        f"soak stored: {seeded.seconds} s ({why}); every process reads it — change it with "
        "lakehouse soak set <seconds>" + (" (a real migration soaks an hour: 3600)" if seeded.seconds == 0 else "")
    )
