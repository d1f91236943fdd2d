"""Sources and the operator surface: the CLI verbs, refusals that write nothing, the jsonb text form, S3
through a real S3-compatible server (moto), and a writer process SIGKILLed mid-write / after its commit."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.sources import get_source, set_source
from lakehouse_dagster.sources.convert import jsonb_text
from lakehouse_dagster.sources.writers import run_writer
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli, cli_json
from .test_writers import SCHEMA, _records, canary_ok, ingest, native, table_rows, write_source_file


@pytest.fixture
def catalog(settings, dsn):
    return load_catalog(settings, dsn)


@pytest.fixture
def dataset(conn):
    return datasets.create_dataset(conn, datasets.create_workspace(conn, "w"), "events", SCHEMA)


def _stored(conn, d):
    return conn.execute("select source, updated_at from datasets where id = %s", (d,)).fetchone()


# --- CLI ------------------------------------------------------------------------------------------------


def test_sources_set_show_and_ingest_through_the_cli(conn, settings, dataset, tmp_path):
    write_source_file(tmp_path / "in" / "a.ndjson", "ndjson", _records(0, 7))
    out = cli_json("sources", "set", "--dataset", str(dataset), "--files", str(tmp_path / "in" / "*.ndjson"))
    assert out["source"] == {"type": "files", "uri": str(tmp_path / "in" / "*.ndjson"), "format": "ndjson"}
    assert out["default_writer"] == "sync.append"
    assert cli_json("sources", "show", "--dataset", str(dataset))["cursor"] is None
    r = cli_json("ingest", "--dataset", str(dataset), "--writer", "sync.append")
    assert (r["path"], r["rows"], r["snapshot_id"], r["cursor"]) == ("pg", 7, None, {"files": 1}) and r["sync_id"]
    shown = cli_json("sources", "show", "--dataset", str(dataset))
    assert shown["cursor"] == {"files": 1} and shown["last_ingest"]["path"] == "pg"
    catalog = load_catalog(settings, settings.postgres.dsn)
    sync_dataset(settings.postgres.dsn, catalog, settings, dataset)  # caught up first
    canary_ok(conn, settings.postgres.dsn, catalog, settings, dataset)  # parity ok, then readers and writer flipped
    native(conn, dataset, "sync.append")
    write_source_file(tmp_path / "in" / "b.ndjson", "ndjson", _records(7, 2))
    r = cli_json("ingest", "--dataset", str(dataset), "--writer", "sync.append")
    assert (r["path"], r["rows"], r["total_rows"], r["cursor"]) == ("native", 2, 9, {"files": 2}) and r["snapshot_id"]
    text = cli("ingest", "--dataset", str(dataset), "--writer", "sync.append", check=True).stdout
    assert "nothing new" in text


@pytest.mark.parametrize("writer", ["ingest.stream", "row.edit", "dataset.manifest", "pipeline.output"])
def test_locked_writer_is_refused_with_its_reason(conn, settings, dataset, tmp_path, writer):
    write_source_file(tmp_path / "a.parquet", "parquet", _records(0, 3))
    set_source(conn, dataset, {"type": "files", "uri": str(tmp_path / "a.parquet")})
    proc = cli("ingest", "--dataset", str(dataset), "--writer", writer)
    assert proc.returncode == 2 and f"writer {writer} is locked to pg (maxMode=pg:" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert conn.execute("select count(*) from dataset_rows").fetchone()[0] == 0


def test_ingest_without_a_source_says_how_to_set_one(settings, dataset):
    proc = cli("ingest", "--dataset", str(dataset), "--writer", "sync.full")
    assert proc.returncode == 2 and f"set one with: lakehouse sources set --dataset {dataset}" in proc.stderr


BAD_SPECS = {
    "missing path": ({"type": "files", "uri": "/nonexistent/dir/x.parquet"}, "no such file or directory"),
    "missing glob dir": ({"type": "files", "uri": "/nonexistent/*.csv"}, "does not exist"),
    "unknown format": ({"type": "files", "uri": "/tmp/x.txt"}, "format None is not one of"),
    "http uri": ({"type": "files", "uri": "http://example.com/x.csv"}, "only local paths, globs and s3:// URIs"),
    "unknown key": ({"type": "files", "uri": "/tmp", "format": "csv", "password": "x"}, "unknown key(s) password"),
    "unknown type": ({"type": "kafka", "topic": "t"}, "source type 'kafka' is not supported"),
    "bad table name": ({"type": "postgres", "table": "public.x; drop table datasets"}, "must be schema.table"),
    "table and query": ({"type": "postgres", "table": "public.src", "query": "select 1"}, "exactly one of"),
    "missing table": ({"type": "postgres", "table": "public.nope"}, "cannot read it"),
    "missing cursor column": (
        {"type": "postgres", "table": "public.src", "cursor_column": "nope"},
        "has no column 'nope'",
    ),
    "source lacks dataset columns": ({"type": "postgres", "query": "select 1 as id"}, "lacks dataset"),
    "not a select": ({"type": "postgres", "query": "delete from datasets"}, "one SELECT statement"),
    "two statements": ({"type": "postgres", "query": "select 1; drop table datasets"}, "one SELECT statement"),
    "cdc op not a dataset column": (
        {"type": "cdc", "table": "public.src", "position_column": "id", "op_column": "op"},
        "must be one of dataset",
    ),
    "cdc without op": ({"type": "cdc", "table": "public.src", "position_column": "id"}, "op column"),
    "dsn var unset": ({"type": "postgres", "table": "public.src", "dsn_env": "LAKEHOUSE_TEST_UNSET_DSN"}, "is not set"),
    "dsn value instead of a name": (
        {"type": "postgres", "table": "public.src", "dsn_env": "postgresql://u:pw@h/db"},
        "must name an environment variable",
    ),
}


@pytest.fixture
def src_table(conn):
    conn.execute(
        "create table public.src (id bigint, op text, name text, n bigint, x float8, ok boolean,"
        " at timestamptz, day date, meta jsonb)"
    )


@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_bad_source_spec_is_refused_and_nothing_is_written(conn, settings, dataset, src_table, case):
    conn.execute("update datasets set source = %s where id = %s", (json.dumps({"type": "demo", "rows": 5}), dataset))
    before = _stored(conn, dataset)
    spec, reason = BAD_SPECS[case]
    with pytest.raises(BadInput) as info:
        set_source(conn, dataset, spec, settings=settings)
    assert reason in str(info.value) and "\n" not in str(info.value) and "pw@" not in str(info.value)
    assert _stored(conn, dataset) == before
    assert get_source(conn, dataset) is None  # a legacy "demo" source reads as no source


@pytest.mark.parametrize(
    "args,reason",
    [
        (["--files", "/nonexistent/x.parquet"], "no such file or directory"),
        (["--postgres-table", "public.src", "--format", "csv"], "--format applies to --files"),
        (["--cdc-table", "public.src", "--position-column", "id", "--cursor-column", "id"], "does not apply"),
    ],
)
def test_bad_source_spec_through_the_cli_is_one_line_exit_2(conn, settings, dataset, src_table, args, reason):
    before = _stored(conn, dataset)
    proc = cli("sources", "set", "--dataset", str(dataset), *args)
    assert proc.returncode == 2 and reason in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert _stored(conn, dataset) == before


# --- the jsonb text form --------------------------------------------------------------------------------

JSON_CORPUS = [
    '{"b": 1, "a": 2, "aa": {"z": [1, 2.50, -0, 1e3, 1.5E-3, -0.0, 12345678901234567890]}}',
    '{"é": "ü", "e": "\\u00e9", "tab": "a\\tb\\u0001\\n\\"\\\\/", "": null}',
    '[true, false, null, "x", {"k": {}}, []]',
    '"just a string"',
    "3.14159265358979323846",
    "-1E+2",
    "0.000",
    '{"dup": 1, "dup": 2}',
    '{"emoji": "😀 \\ud83d\\ude00", "ctl": "\\u001f\\u007f"}',
]


def test_jsonb_text_is_postgres_own_form(conn):
    for text in JSON_CORPUS:
        want = conn.execute("select %s::jsonb::text", (text,)).fetchone()[0]
        assert jsonb_text(text) == want, text
    assert jsonb_text("null") is None


# --- S3 -------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3(monkeypatch):
    """A real S3 HTTP endpoint on loopback (moto_server)."""
    port = _free_port()
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    endpoint = f"http://127.0.0.1:{port}"
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "LAKEHOUSE_S3_ENDPOINT": endpoint,
    }.items():
        monkeypatch.setenv(k, v)
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    deadline = time.monotonic() + 30
    while True:
        try:
            client.list_buckets()
            break
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("moto_server did not start") from None  # never skipped
            time.sleep(0.2)
    yield client
    proc.terminate()
    proc.wait(10)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_s3_files_source_through_an_s3_compatible_endpoint(conn, dsn, catalog, settings, dataset, tmp_path, s3):
    from lakehouse_dagster.core.settings import Settings

    s3.create_bucket(Bucket="landing")
    for name, start in (("a", 0), ("b", 6)):
        write_source_file(tmp_path / f"{name}.parquet", "parquet", _records(start, 6))
        s3.upload_file(str(tmp_path / f"{name}.parquet"), "landing", f"events/{name}.parquet")
    s3.put_object(Bucket="landing", Key="other/c.parquet", Body=b"not matched")
    settings = Settings.from_env()
    set_source(conn, dataset, {"type": "files", "uri": "s3://landing/events/*.parquet"}, settings=settings)
    native(conn, dataset, "sync.append")
    r = ingest(dsn, catalog, settings, conn, dataset, "sync.append")
    assert (r.path, r.rows, r.cursor) == ("native", 12, {"files": 2})
    assert [x["n"] for x in table_rows(catalog, settings, dataset)] == [x["n"] for x in _records(0, 12)]
    s3.upload_file(str(tmp_path / "a.parquet"), "landing", "events/c.parquet")
    assert ingest(dsn, catalog, settings, conn, dataset, "sync.append").rows == 6


# --- kills ----------------------------------------------------------------------------------------------


def _kill_ingest_at(point: str, dataset, tmp_path) -> None:
    """Run `lakehouse ingest` in its own process; it SIGKILLs itself at failpoint ``point`` (core/failpoints.py)."""
    env = {**os.environ, "LAKEHOUSE_FAILPOINT": f"{point}:kill", "LAKEHOUSE_INGEST_CHUNK_ROWS": "10"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lakehouse_dagster.cli.main",
            "ingest",
            "--dataset",
            str(dataset),
            "--writer",
            "sync.append",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_retry_with_the_killed_runs_sync_id_finds_its_commit(conn, dsn, catalog, settings, dataset, tmp_path):
    write_source_file(tmp_path / "src" / "a.csv", "csv", _records(0, 20))
    set_source(conn, dataset, {"type": "files", "uri": str(tmp_path / "src"), "format": "csv"})
    native(conn, dataset, "sync.append")
    _kill_ingest_at("after-commit-before-log", dataset, tmp_path)  # committed, but nobody heard back: outcome unknown
    (sync_id,) = conn.execute("select sync_id from iceberg_sync_log where dataset_id = %s", (dataset,)).fetchone()
    r = run_writer(dsn, catalog, settings, FlagResolver(conn, 0), dataset, "sync.append", sync_id=sync_id)
    assert r.rows == 0 and r.total_rows == 20  # not appended twice
    assert [x["n"] for x in table_rows(catalog, settings, dataset)] == [x["n"] for x in _records(0, 20)]
    assert conn.execute(
        "select status, snapshot_id is not null from iceberg_sync_log where sync_id = %s", (sync_id,)
    ).fetchone() == ("succeeded", True)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
@pytest.mark.parametrize("mode", ["pg", "native"])
@pytest.mark.parametrize("point", ["after-first-batch", "after-commit-before-log"])
def test_writer_killed_mid_write_or_after_commit_never_reingests_or_skips(
    conn, dsn, catalog, settings, dataset, tmp_path, mode, point
):
    src = tmp_path / "src"
    write_source_file(src / "a.csv", "csv", _records(0, 30))
    write_source_file(src / "b.csv", "csv", _records(30, 30))
    set_source(conn, dataset, {"type": "files", "uri": str(src), "format": "csv"})
    if mode == "native":
        native(conn, dataset, "sync.append")
    _kill_ingest_at(point, dataset, tmp_path)
    write_source_file(src / "c.csv", "csv", _records(60, 5))
    r = ingest(dsn, catalog, settings, conn, dataset, "sync.append")
    # after the commit the first run's files count as ingested; mid-write nothing did
    assert (
        r.rows == (5 if point == "after-commit-before-log" else 65) and r.total_rows == 65 and r.cursor == {"files": 3}
    )
    if mode == "pg":
        sync_dataset(dsn, catalog, settings, dataset)
    rows = table_rows(catalog, settings, dataset)
    assert [x["n"] for x in rows] == [x["n"] for x in _records(0, 65)]  # each source row exactly once
    assert [x["__row_index"] for x in rows] == list(range(65))
    if mode == "native":
        assert conn.execute("select count(*) from dataset_rows").fetchone()[0] == 0
        statuses = sorted(
            s for (s,) in conn.execute("select status from iceberg_sync_log where dataset_id = %s", (dataset,))
        )
        # the killed sync was found by the next one: succeeded if its commit landed, failed otherwise
        assert statuses == (
            ["succeeded", "succeeded"] if point == "after-commit-before-log" else ["failed", "succeeded"]
        )
        assert conn.execute("select row_count from datasets where id = %s", (dataset,)).fetchone()[0] == 65
        leftovers = [p for p in Path(settings.catalog.warehouse.removeprefix("file://")).rglob("*.parquet")]
        # 10-row chunks: the killed run's 6 committed files stay, its uncommitted ones are removed; + 1 file now
        assert len(leftovers) == (6 + 1 if point == "after-commit-before-log" else 1)


def test_source_dsn_secret_never_shows_in_errors(conn, dsn, catalog, settings, dataset, monkeypatch):
    conn.execute(
        "create table public.src (id bigint, name text, n bigint, x float8, ok boolean,"
        " at timestamptz, day date, meta jsonb)"
    )
    conn.execute("insert into public.src (id, n) values (1, 1)")
    monkeypatch.setenv("SRC_DSN", dsn)
    spec = set_source(
        conn, dataset, {"type": "postgres", "table": "public.src", "cursor_column": "id", "dsn_env": "SRC_DSN"}
    )
    assert spec.to_json()["dsn_env"] == "SRC_DSN" and dsn not in json.dumps(spec.to_json())
    stored = conn.execute("select source::text from datasets where id = %s", (dataset,)).fetchone()[0]
    assert "postgresql://" not in stored
    assert ingest(dsn, catalog, settings, conn, dataset, "sync.incremental").rows == 1
    secret = "postgresql://reader:S3cretPw@127.0.0.1:1/nowhere"
    monkeypatch.setenv("SRC_DSN", secret)
    conn.execute("insert into public.src (id, n) values (2, 2)")
    with pytest.raises(Exception) as info:
        ingest(dsn, catalog, settings, conn, dataset, "sync.incremental")
    assert "cannot read it" in str(info.value) and "S3cretPw" not in str(info.value)
    error = conn.execute("select error from datasets where id = %s", (dataset,)).fetchone()[0]
    assert "S3cretPw" not in error
    proc = cli(
        "sources",
        "set",
        "--dataset",
        str(dataset),
        "--postgres-table",
        "public.src",
        "--dsn-env",
        "SRC_DSN",
        env={"SRC_DSN": secret},
    )
    assert proc.returncode == 2 and "cannot connect" in proc.stderr and "S3cretPw" not in proc.stderr
