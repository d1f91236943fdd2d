"""The soak, stored: one value the CLI and every Dagster process (webserver, daemon, run workers) read the same way.

How the stored value and ``LAKEHOUSE_SOAK_SECONDS`` combine:

* a value stored in ``lakehouse_settings`` (``lakehouse soak set <seconds>``, audited in
  ``lakehouse_settings_audit``) is the soak, for every process on that database; ``LAKEHOUSE_SOAK_SECONDS`` is then
  ignored (``lakehouse soak show`` says so when it is set in the shell);
* with nothing stored, each process uses its own ``LAKEHOUSE_SOAK_SECONDS`` (default 3600): the env var only seeds
  the default. ``lakehouse up`` stores it the first time it starts on a database with nothing stored (with the demo:
  0, unless the variable is set), so a stack that was started once reads one value everywhere.

A soak of 0 only drops the waiting: the runbooks' order (a dataset flip before a workspace flip before a global one,
and the writers one at a time) holds whatever the soak (flags/widen.py).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

import psycopg
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.db import fetch_one
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.settings import Settings

SOAK = "soak_seconds"
STORED, ENV, DEFAULT = "stored", "LAKEHOUSE_SOAK_SECONDS", "default"
_LOCK = "lakehouse_settings:soak_seconds"  # one writer of the setting at a time: the audit's before is exact
MAX_SOAK_SECONDS = 30 * 24 * 3600  # a month: anything longer is a typo (e.g. milliseconds)


@dataclasses.dataclass(frozen=True)
class SoakSetting:
    seconds: int
    source: str  # stored | LAKEHOUSE_SOAK_SECONDS | default
    set_by: str | None = None
    set_at: datetime | None = None
    note: str | None = None

    def describe(self) -> str:
        if self.source == STORED:
            at = f" at {self.set_at:%Y-%m-%d %H:%M:%S} UTC" if self.set_at else ""
            note = f"; note: {self.note}" if self.note else ""
            return f"{self.seconds} s (stored: set by {self.set_by}{at}{note})"
        where = "LAKEHOUSE_SOAK_SECONDS of this process" if self.source == ENV else "the default"
        return f"{self.seconds} s ({where}; nothing stored: lakehouse soak set <seconds> stores it for every process)"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def check_seconds(seconds: object) -> int:
    """A soak in whole seconds, 0 to a month; BadInput naming what was wrong."""
    try:
        value = int(str(seconds).strip())
    except ValueError:
        raise BadInput(
            f"soak {seconds!r} is not a whole number of seconds (e.g. 3600 for an hour, 0 for none)"
        ) from None
    if value < 0:
        raise BadInput(f"soak {value} is negative; give 0 (no waiting) or more seconds")
    if value > MAX_SOAK_SECONDS:
        raise BadInput(
            f"soak {value} s is over {MAX_SOAK_SECONDS} s (30 days); give it in seconds, e.g. 3600 for an hour"
        )
    return value


def stored_soak(conn: psycopg.Connection) -> SoakSetting | None:
    row = conn.execute("select value, set_by, set_at, note from lakehouse_settings where name = %s", (SOAK,)).fetchone()
    if row is None:
        return None
    return SoakSetting(int(row[0]), STORED, row[1], row[2], row[3])


def current_soak(conn: psycopg.Connection, settings: Settings | None = None) -> SoakSetting:
    """The soak every gate applies: the stored value, else this process' LAKEHOUSE_SOAK_SECONDS (default 3600)."""
    stored = stored_soak(conn)
    if stored is not None:
        return stored
    settings = settings or Settings.from_env()
    return SoakSetting(settings.rollout.soak_seconds, ENV if settings.rollout.soak_seconds_given else DEFAULT)


def set_soak(
    conn: psycopg.Connection, seconds: object, *, note: str | None, actor: str
) -> tuple[SoakSetting | None, SoakSetting]:
    """Store the soak (audited, one transaction); (before, after). Validates before writing anything."""
    value = check_seconds(seconds)
    note = (note or "").strip() or None
    if note and len(note) > 1000:
        raise BadInput(f"--note is {len(note)} characters; keep it under 1000")
    if not actor or not actor.strip():
        raise BadInput("no actor: set LAKEHOUSE_ACTOR to who is making the change")
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(hashtextextended(%s, 0))", (_LOCK,))
        previous = stored_soak(conn)
        row = fetch_one(
            conn.execute(
                "insert into lakehouse_settings (name, value, note, set_by, set_at) values (%s, %s, %s, %s, now())"
                " on conflict (name) do update set value = excluded.value, note = excluded.note,"
                " set_by = excluded.set_by, set_at = excluded.set_at returning set_at",
                (SOAK, Jsonb(value), note, actor.strip()),
            ),
            "the soak setting just written",
        )
        conn.execute(
            "insert into lakehouse_settings_audit (name, before_value, after_value, note, actor)"
            " values (%s, %s, %s, %s, %s)",
            (SOAK, None if previous is None else Jsonb(previous.seconds), Jsonb(value), note, actor.strip()),
        )
    return previous, SoakSetting(value, STORED, actor.strip(), row[0], note)


def seed_soak(conn: psycopg.Connection, seconds: int, *, note: str, actor: str) -> SoakSetting | None:
    """Store ``seconds`` only when nothing is stored yet (audited); the stored setting, or None when one existed."""
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(hashtextextended(%s, 0))", (_LOCK,))
        if stored_soak(conn) is not None:
            return None
        _, after = set_soak(conn, seconds, note=note, actor=actor)
    return after


def soak_history(conn: psycopg.Connection, limit: int = 20) -> list[dict]:
    """The audit of the soak, newest first."""
    return value_history(conn, SOAK, limit)


def value_history(conn: psycopg.Connection, name: str, limit: int = 20) -> list[dict]:
    """The audit of one stored value (the soak, the shadow proof's threshold...), newest first."""
    rows = conn.execute(
        "select id, at, before_value, after_value, note, actor from lakehouse_settings_audit"
        " where name = %s order by id desc limit %s",
        (name, limit),
    ).fetchall()
    return [{"id": r[0], "at": r[1], "before": r[2], "after": r[3], "note": r[4], "actor": r[5]} for r in rows]


# Other values stored the same way (lakehouse_settings, audited): the shadow proof's threshold (flags/proof.py).


@dataclasses.dataclass(frozen=True)
class StoredValue:
    value: object
    set_by: str
    set_at: datetime
    note: str | None


def stored_value(conn: psycopg.Connection, name: str) -> StoredValue | None:
    """The value stored under ``name``, or None."""
    row = conn.execute("select value, set_by, set_at, note from lakehouse_settings where name = %s", (name,)).fetchone()
    return None if row is None else StoredValue(row[0], row[1], row[2], row[3])


def store_value(conn: psycopg.Connection, name: str, value: object, *, note: str | None, actor: str) -> StoredValue:
    """Store ``value`` under ``name`` with its audit row, one writer at a time (the audit's before is exact)."""
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"lakehouse_settings:{name}",))
        previous = stored_value(conn, name)
        row = fetch_one(
            conn.execute(
                "insert into lakehouse_settings (name, value, note, set_by, set_at) values (%s, %s, %s, %s, now())"
                " on conflict (name) do update set value = excluded.value, note = excluded.note,"
                " set_by = excluded.set_by, set_at = excluded.set_at returning set_at",
                (name, Jsonb(value), note, actor),
            ),
            f"the setting {name} just written",
        )
        conn.execute(
            "insert into lakehouse_settings_audit (name, before_value, after_value, note, actor)"
            " values (%s, %s, %s, %s, %s)",
            (name, None if previous is None else Jsonb(previous.value), Jsonb(value), note, actor),
        )
    return StoredValue(value, actor, row[0], note)
