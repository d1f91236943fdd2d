"""`lakehouse shadow-proof set|show` (issue 43): the shadow proof's threshold stored for every process on a database
without a process environment, validated (a bad value writes nothing), audited, and applied by a flip's gate.
Real Postgres, the CLI in-process, comparisons as the shadow workers record them."""

from __future__ import annotations

import json

from lakehouse_dagster.flags.gates import Effect, proof_blockers
from lakehouse_dagster.flags.proof import PROOF_READS, needed_reads, record_shadow_read
from lakehouse_dagster.flags.registry import REGISTRY
from lakehouse_dagster.flags.soak_setting import stored_value
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "n", "type": "int64"}]


def _audit(conn) -> list[tuple]:
    return conn.execute(
        "select before_value, after_value, note, actor from lakehouse_settings_audit where name = %s order by id",
        (PROOF_READS,),
    ).fetchall()


def test_shadow_proof_set_stores_the_threshold_every_process_applies(conn, settings, lh, monkeypatch):
    monkeypatch.delenv("LAKEHOUSE_SHADOW_PROOF_READS", raising=False)
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    digest = conn.execute("select md5(schema::text) from datasets where id = %s", (d,)).fetchone()[0]
    for _ in range(2):  # two comparisons, both equal: proven for a threshold of 2, not for the default 300
        record_shadow_read(
            conn, ("dashboards.aggregate", d, "match", 1, 1, 1, 1, 1, None, None, None, 0.01, None, digest)
        )
    flag = REGISTRY["read"]["dashboards.aggregate"]
    up = [Effect(d, "d", "shadow", "iceberg")]
    plain = settings.replace(shadow={"proof_reads": 300, "proof_reads_given": False})  # a daemon: nothing set

    code, out, _ = lh("shadow-proof", "show")
    assert code == 0 and out.startswith("shadow proof: 300 in a row (the default; nothing stored)"), out
    assert len(proof_blockers(conn, flag, up, {})) == 1  # 2 of 300: refused

    # bad values: one line saying what was wrong, exit 2, nothing stored, nothing audited
    for bad, says in (
        ("three", "is not a whole number of comparisons"),
        ("0", "is below 1"),
        ("-5", "is below 1"),
        ("2000000", "is over 1,000,000"),
    ):
        code, out, err = lh("shadow-proof", "set", bad)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, (bad, err)
    code, _, err = lh("shadow-proof", "set", "2", env={"LAKEHOUSE_ACTOR": " "})
    assert code == 2 and "no actor" in err
    assert stored_value(conn, PROOF_READS) is None and _audit(conn) == []

    code, out, _ = lh("shadow-proof", "set", "2", "--note", "a small corpus")
    assert code == 0 and "shadow proof: nothing stored → 2 in a row, stored (by pytest; note: a small corpus)" in out
    assert _audit(conn) == [(None, 2, "a small corpus", "pytest")]
    # every process applies it, whatever it was started with: the gate lets the flip through now
    assert needed_reads(plain, conn) == 2 and proof_blockers(conn, flag, up, {}) == []

    code, out, _ = lh("shadow-proof", "set", " 500 ", "--json")
    assert code == 0 and json.loads(out)["before"]["reads"] == 2 and json.loads(out)["after"]["reads"] == 500
    assert len(proof_blockers(conn, flag, up, {})) == 1
    assert _audit(conn)[-1] == (2, 500, None, "pytest")

    # show: the stored value, who set it, the audit newest first; a shell that sets another value is told what a flip
    # from it would do (store it), and showing stores nothing
    code, out, _ = lh("shadow-proof", "show", env={"LAKEHOUSE_SHADOW_PROOF_READS": "7"})
    assert code == 0 and out.startswith("shadow proof: 500 in a row (stored for every process: set by pytest at "), out
    assert "LAKEHOUSE_SHADOW_PROOF_READS=7 in this shell differs" in out
    newest, oldest = out.splitlines()[-2:]  # the audit, newest first
    assert " 2 " in newest and " 500 " in newest and "corpus" not in newest and "a small corpus" in oldest, out
    assert len(_audit(conn)) == 2 and stored_value(conn, PROOF_READS).value == 500
