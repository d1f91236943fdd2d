"""The demo workspace on a real Postgres: coverage of types and edges, idempotence, the runbook's 2b query,
and the `lakehouse demo` / `lakehouse pg` commands' refusals."""

from __future__ import annotations

import json
import math
import re
import threading
import uuid
from datetime import date, datetime
from pathlib import Path

import psycopg
import psycopg.sql
import pytest

from lakehouse_dagster.cli.main import main
from lakehouse_dagster.core.db import connect
from lakehouse_dagster.demo.workspace import DEMO_WORKSPACE_ID, EVENTS_SCHEMA, demo_id, seed_demo
from lakehouse_dagster.flags.candidates import RUNBOOK_SAFE_BLOCKED
from lakehouse_dagster.tracking.datasets import COLUMN_TYPES, pipeline_input_dataset_ids

BIG = 3_000  # the generator is the same SQL for 1M rows; a few thousand rows reach every branch of it

RUNBOOK = Path(__file__).resolve().parents[2] / "shared" / "seeds" / "000_e6196d64338b6ec4.txt"

I64 = (-(2**63), 2**63 - 1)
FLOAT_WORDS = {"NaN", "Infinity", "-Infinity"}


def _valid(typ: str, v) -> bool:
    """Does a JSON value fit the declared column type (the contract the mirror enforces)?"""
    if typ == "int64":
        return isinstance(v, int) and not isinstance(v, bool) and I64[0] <= v <= I64[1]
    if typ == "float64":
        if isinstance(v, str):
            return v in FLOAT_WORDS
        return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isinf(float(v))
    if typ == "string":
        return isinstance(v, str)
    if typ == "boolean":
        return isinstance(v, bool)
    if typ == "timestamp":
        return isinstance(v, str) and datetime.fromisoformat(v).tzinfo is not None
    if typ == "date":
        return isinstance(v, str) and bool(date.fromisoformat(v))
    return typ == "json"


def _counts(conn):
    return conn.execute(
        "select (select count(*) from workspaces), (select count(*) from datasets), (select count(*) from dataset_rows),"
        " (select count(*) from pipelines), (select coalesce(sum(rows_version), 0) from datasets)"
    ).fetchone()


def test_demo_covers_every_type_null_unicode_and_pipeline_input(conn):
    summary = seed_demo(conn, big_rows=BIG)
    assert summary["created"] and summary["workspace_id"] == str(DEMO_WORKSPACE_ID)
    by_name = {d["name"]: d for d in summary["datasets"]}
    assert by_name["events"]["rows"] == BIG
    assert by_name["product_images"]["kind"] == "manifest"
    assert by_name["empty"]["rows"] == 0
    sizes = sorted({d["rows"] for d in summary["datasets"] if d["kind"] == "tabular" and d["rows"]})
    assert len(sizes) >= 4  # several sizes

    # datasets.row_count tells the truth for every demo dataset
    for d_id, rc, n in conn.execute(
        "select d.id, d.row_count, (select count(*) from dataset_rows r where r.dataset_id = d.id)"
        " from datasets d where d.workspace_id = %s",
        (DEMO_WORKSPACE_ID,),
    ):
        assert rc == n, d_id

    # every value of every tabular demo dataset fits its declared type; every column has nulls and values
    schemas = conn.execute(
        "select id, name, schema from datasets where workspace_id = %s and kind = 'tabular'", (DEMO_WORKSPACE_ID,)
    ).fetchall()
    seen_types: set[str] = set()
    for d_id, name, schema in schemas:
        rows = [r[0] for r in conn.execute("select data from dataset_rows where dataset_id = %s", (d_id,))]
        for col in schema:
            seen_types.add(col["type"])
            values = [r.get(col["name"]) for r in rows]
            bad = [v for v in values if v is not None and not _valid(col["type"], v)]
            assert not bad, f"{name}.{col['name']} ({col['type']}): {bad[:3]}"
            if name in ("events", "edge_cases"):
                assert any(v is None for v in values) and any(v is not None for v in values), (name, col)
    assert seen_types == set(COLUMN_TYPES)
    assert {c["type"] for c in EVENTS_SCHEMA} == set(COLUMN_TYPES)  # the big one alone has every type

    ev = demo_id("events")

    def one(q: str):
        return conn.execute(q, {"ds": ev}).fetchone()[0]

    # nulls both ways: a JSON null and a missing key, in the big dataset
    assert one("select count(*) from dataset_rows where dataset_id = %(ds)s and data->'amount' = 'null'::jsonb") > 0
    assert one("select count(*) from dataset_rows where dataset_id = %(ds)s and not data ? 'amount'") > 0
    # unicode beyond the BMP, CJK, RTL, combining marks, control characters and the empty string
    names = {
        r[0]
        for r in conn.execute(
            "select distinct data->>'user_name' from dataset_rows where dataset_id = %(ds)s", {"ds": ev}
        )
    }
    assert {
        "日本語テキスト",
        "שלום",
        "emoji 🙂🚀",
        "e\u0301 combining",
        "",
        'quote " backslash \\ tab \t newline \n',
    } <= names
    # timestamps: ISO text with offsets (and Z), several zones, some before 1970; all parse in Postgres too
    offsets = {
        r[0]
        for r in conn.execute(
            "select distinct substring(data->>'occurred_at' from '(Z|[+-][0-9]{2}:[0-9]{2})$')"
            "  from dataset_rows where dataset_id = %(ds)s and data->>'occurred_at' is not null",
            {"ds": ev},
        )
    }
    assert {"Z", "+00:00", "+05:30", "-08:00", "+12:45", "-03:30"} <= offsets
    assert (
        one(
            "select min((data->>'occurred_at')::timestamptz) < '1970-01-01' from dataset_rows where dataset_id = %(ds)s"
        )
        is True
    )
    # floats: 0.1, 1e-300, subnormal, max, and the words; every value converts to float8 in Postgres
    floats = [
        r[0]
        for r in conn.execute(
            "select (data->>'amount')::float8 from dataset_rows where dataset_id = %(ds)s and jsonb_typeof(data->'amount')"
            " in ('number', 'string')",
            {"ds": ev},
        )
    ]
    for expected in (0.1, 1e-300, 5e-324, 1.7976931348623157e308, -2.5, math.inf, -math.inf):
        assert expected in floats, expected
    assert any(math.isnan(f) for f in floats)
    assert {9223372036854775807, -9223372036854775808} <= {
        r[0]
        for r in conn.execute(
            "select (data->>'event_id')::bigint from dataset_rows where dataset_id = %(ds)s", {"ds": ev}
        )
    }
    # nested json of every JSON kind
    kinds = {
        r[0]
        for r in conn.execute(
            "select distinct jsonb_typeof(data->'payload') from dataset_rows where dataset_id = %(ds)s", {"ds": ev}
        )
    }
    assert kinds == {"object", "array", "string", "number", "boolean", "null", None}
    assert (
        one(
            "select count(*) from dataset_rows where dataset_id = %(ds)s"
            " and data #> '{payload,meta,depth,n}' is not null"
        )
        > 0
    )
    assert (
        one(
            "select count(*) from dataset_rows where dataset_id = %(ds)s and (data->>'event_date')::date = '2024-02-29'"
        )
        > 0
    )

    # pipeline inputs: the two `dataset` nodes; the output node and the malformed ids are not inputs
    assert pipeline_input_dataset_ids(conn) == {demo_id("customers"), demo_id("orders")}


def test_seeding_is_idempotent_even_when_racing(conn, dsn):
    results: list[dict] = []
    errors: list[BaseException] = []

    def seed():
        try:
            with connect(dsn) as c:
                results.append(seed_demo(c, big_rows=500))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=seed) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert sorted(r["created"] for r in results) == [False, True]
    before = _counts(conn)
    again = seed_demo(conn, big_rows=10_000)  # a different size changes nothing: the demo is there
    assert again["created"] is False and _counts(conn) == before
    assert {d["name"]: d["rows"] for d in again["datasets"]}["events"] == 500


def test_runbook_safe_blocked_query_runs_unchanged(conn):
    if RUNBOOK.exists():  # the constant above is the runbook's text, character for character
        text = RUNBOOK.read_text()
        start = text.index("with latest as (")
        end = text.index("nulls last;", start) + len("nulls last;")
        assert text[start:end] == RUNBOOK_SAFE_BLOCKED
    seed_demo(conn, big_rows=BIG)

    def log(name: str, status: str, identity: bool, finished: str):
        conn.execute(
            "insert into iceberg_sync_log (dataset_id, sync_id, status, has_identity, started_at, finished_at, rows)"
            " values (%s, %s, %s, %s, %s::timestamptz - interval '1 minute', %s::timestamptz, 0)",
            (demo_id(name), uuid.uuid4(), status, identity, finished, finished),
        )

    for name in ("events", "customers", "orders", "customer_rollup"):
        log(name, "succeeded", True, "2024-05-01T10:00:00Z")
    log("edge_cases", "succeeded", True, "2024-05-01T09:00:00Z")
    log("edge_cases", "failed", False, "2024-05-01T11:00:00Z")  # latest attempt failed: not a candidate
    log("empty", "succeeded", False, "2024-05-01T10:00:00Z")  # no identity: not a candidate

    with conn.cursor() as cur:
        cur.execute(RUNBOOK_SAFE_BLOCKED.encode())  # bytes: executed exactly as written, no placeholders
        got = [(r[0], r[1], r[2], r[3]) for r in cur.fetchall()]
    assert got == [
        ("BLOCKED (pipeline input)", "orders", 20_000, demo_id("orders")),
        ("BLOCKED (pipeline input)", "customers", 1_000, demo_id("customers")),
        ("SAFE", "events", BIG, demo_id("events")),
        ("SAFE", "customer_rollup", 8, demo_id("customer_rollup")),
    ]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_demo_seed_cli_json_and_refusals(settings, conn, capsys):
    code, out, err = _run(capsys, "demo", "status", "--json")
    assert code == 3 and json.loads(out)["present"] is False
    for bad in ("0", "-5", "many", "1.5"):
        with pytest.raises(SystemExit) as exc:
            main(["demo", "seed", "--rows", bad])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--rows" in err
    assert _counts(conn)[:4] == (0, 0, 0, 0)  # refused: nothing written

    code, out, err = _run(capsys, "demo", "seed", "--rows", "1_000", "--json")
    assert code == 0, err
    first = json.loads(out)
    assert first["created"] is True and {d["name"]: d["rows"] for d in first["datasets"]}["events"] == 1000
    code, out, _ = _run(capsys, "demo", "seed", "--json")
    assert code == 0 and json.loads(out)["created"] is False
    code, out, _ = _run(capsys, "demo", "status")
    assert code == 0 and "events" in out and "customer_orders_rollup" in out


def test_demo_seed_refuses_an_unmigrated_database(pg_admin_dsn, monkeypatch, capsys):
    from lakehouse_dagster.testing.pg import with_db

    name = f"t_empty_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(name)))
    try:
        monkeypatch.setenv("LAKEHOUSE_PG_DSN", with_db(pg_admin_dsn, name))
        code, out, err = _run(capsys, "demo", "seed", "--rows", "10")
        assert code == 2 and err.count("\n") == 1 and "lakehouse db migrate" in err
        with psycopg.connect(with_db(pg_admin_dsn, name)) as c:
            assert c.execute("select count(*) from pg_tables where schemaname = 'public'").fetchone()[0] == 0
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(
                psycopg.sql.SQL("drop database if exists {} with (force)").format(psycopg.sql.Identifier(name))
            )


def test_pg_commands_never_show_a_password_and_refuse_when_external(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAKEHOUSE_PG_DSN", "postgresql://app:s3cr3t-pw@127.0.0.1:1/appdb")
    code, out, err = _run(capsys, "pg", "status", "--json")
    assert code == 0 and json.loads(out) == {"embedded": False, "dsn": "postgresql://app:***@127.0.0.1:1/appdb"}
    for verb in ("start", "stop"):
        code, out, err = _run(capsys, "pg", verb)
        assert code == 2 and err.count("\n") == 1 and "LAKEHOUSE_PG_DSN is set" in err
        assert "s3cr3t" not in out + err
    monkeypatch.delenv("LAKEHOUSE_PG_DSN")
    code, out, _ = _run(capsys, "pg", "status", "--json")
    assert code == 3 and json.loads(out)["running"] is False
    assert not (tmp_path / "home").exists()  # status and refusals wrote nothing
    assert re.search(r"s3cr3t", out) is None
