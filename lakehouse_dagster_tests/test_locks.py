"""Lock namespaces are listed once and distinct (issue 42, item 8: the stream's shard lock and the first-native hold
shared 0x1A4E_0300), and a dataset's lock key hashes its whole id (v1/v7 ids made within ~65 s share their first 32
bits)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from lakehouse_dagster.core import locks

PACKAGE = Path(__file__).resolve().parents[1] / "lakehouse_dagster"


def test_every_namespace_is_distinct_and_listed_in_one_place():
    values = list(locks.NAMESPACES.values())
    assert len(set(values)) == len(values)
    assert len(set(locks.NAMED)) == len(locks.NAMED)
    literal = re.compile(r"0x1A4E_[0-9A-F]{4}", re.IGNORECASE)
    elsewhere = {
        str(p.relative_to(PACKAGE)): literal.findall(p.read_text())
        for p in PACKAGE.rglob("*.py")
        if p.name != "locks.py" and literal.search(p.read_text())
    }
    assert elsewhere == {}, "a lock namespace outside core/locks.py"
    named = set(re.findall(r"hashtextextended\('([a-z_:]+)'", "".join(p.read_text() for p in PACKAGE.rglob("*.py"))))
    assert named <= set(locks.NAMED)


def test_a_dataset_lock_key_hashes_the_whole_id():
    a = uuid.UUID("0190a1b2-0000-7000-8000-000000000001")  # v7 ids made in the same ~65 s: same first 32 bits
    b = uuid.UUID("0190a1b2-ffff-7fff-bfff-ffffffffffff")
    assert a.bytes[:4] == b.bytes[:4]
    assert locks.dataset_key(a) != locks.dataset_key(b)
    assert -(2**31) <= locks.dataset_key(a) < 2**31
    assert locks.dataset_key(a) == locks.dataset_key(uuid.UUID(str(a)))  # stable: the same in every process


def test_the_guards_take_their_locks_in_the_listed_namespaces(conn):
    from lakehouse_dagster.core.guards import dataset_lock, first_native_hold

    d = uuid.uuid4()
    seen = "select classid::bigint, objid::bigint from pg_locks where locktype = 'advisory' and pid = pg_backend_pid()"
    with dataset_lock(conn, d):
        assert conn.execute(seen).fetchall() == [(locks.DATASET, locks.dataset_key(d) & 0xFFFFFFFF)]
    with first_native_hold(conn, d):
        assert conn.execute(seen).fetchall() == [(locks.FIRST_NATIVE, locks.dataset_key(d) & 0xFFFFFFFF)]
    assert locks.FIRST_NATIVE != locks.STREAM_SHARD
