"""A full reverse re-sync COPYs its rows straight into dataset_rows with their jsonb built client-side
(lake/copy_back.py ``rows_batches``); the rows it writes must be exactly those the staging path writes (the pg path's
jsonb expression, ``data_expr``): the same ``data`` as jsonb and as text (numeric scale included), the same identity
and the same maintained digest. Over every column type a dataset may have, with the values that are hard to write
as Postgres does: floats of every magnitude, NaN/±Infinity, -0, subnormals; timestamps of every year, fractions,
pre-1970; dates; text with quotes, backslashes, control characters and unicode; json of every shape; nulls."""

from __future__ import annotations

import json
import logging
import uuid

import numpy as np
import pyarrow as pa
import pytest

from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake import copy_back
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.lake.errors import ClientJsonbUnsupported
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.lake.writer import TableWrite
from lakehouse_dagster.mirror import reverse
from lakehouse_dagster.mirror.reverse import apply_reverse
from lakehouse_dagster.routing.native_table import write_native_table
from lakehouse_dagster.routing.write_router import route_write
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli
from .native_helpers import runbook_ready
from .test_reverse_mirror import _digest_is_exact

EVERY_TYPE = [
    {"name": "s", "type": "string"},
    {"name": "i", "type": "int64"},
    {"name": "f", "type": "float64"},
    {"name": "b", "type": "boolean"},
    {"name": "t", "type": "timestamp"},
    {"name": "d", "type": "date"},
    {"name": "j", "type": "json"},
    {"name": 'ünï "q"', "type": "float64"},  # a key that needs escaping
]
N = 4000


def _floats(rng) -> list:
    edge = [0.0, -0.0, 0.1, 0.1 + 0.2, 1.0, 100.0, 1e15, 1e16, 1e17, 1e21, 1e22, 123456789012345678.0, 1e-5, 1e-6,
            1e-7, 1.5e-7, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1e300, 1e-300, float("nan"),
            float("inf"), float("-inf"), 0.5, 2.5, 1 / 3, 2**53, 2**53 + 2.0, -123.456, 9007199254740993.0]  # fmt: skip
    bits = rng.integers(0, 2**63, N, dtype=np.int64).view(np.float64)  # any bit pattern: subnormals, NaNs, huge
    scaled = rng.standard_normal(N) * 10.0 ** rng.integers(-30, 30, N)
    out = [
        *edge,
        *bits[: N // 3].tolist(),
        *scaled[: N // 3].tolist(),
        *(rng.integers(-(10**6), 10**6, N) / 100).tolist(),
    ]
    return [None if k % 17 == 0 else v for k, v in enumerate(out[:N])]


def _texts(rng) -> list:
    alphabet = ['"', "\\", "/", "\b", "\f", "\n", "\r", "\t", "\x01", "\x1f", "\x7f", "é", "日本", "😀", "\u2028",
                "{", "}", ",", ":", "a", " ", "null", "\\u0041"]  # fmt: skip
    out = ["", " ", "plain"]
    while len(out) < N:
        out.append("".join(rng.choice(alphabet, rng.integers(0, 12))))
    return [None if k % 13 == 0 else v for k, v in enumerate(out)]


def _docs(rng) -> list:
    def value(depth: int):
        kind = int(rng.integers(0, 9 if depth < 3 else 6))
        if kind == 6:
            return [value(depth + 1) for _ in range(rng.integers(0, 4))]
        if kind == 7:
            return {f"k{i}": value(depth + 1) for i in range(rng.integers(0, 4))}
        return [
            None,
            True,
            int(rng.integers(-(2**62), 2**62)),
            float(rng.standard_normal()),
            'te"x}t,\\ é\n',
            "",
            None,
            None,
            {"dup": 1, "nested": {"a": [1, {"b": "}"}]}},
        ][kind]

    raw = ['{"a": 1.50, "b": 1e5, "c": 100000000000000000000001, "d": -0, "e": 1.0E-2}', ' [1, 2 ,\n  3] ',
           '"text"', "12.500", "true", "null", '{"a": 1, "a": 2}', '{"\\u00e9": "\\ud83d\\ude00"}', "[]", "{}"]  # fmt: skip
    out = [*raw]
    while len(out) < N:
        v = value(0)
        out.append(json.dumps(v, indent=2 if len(out) % 3 == 0 else None, ensure_ascii=len(out) % 2 == 0))
    return [None if k % 11 == 0 else v for k, v in enumerate(out)]


def _batch(rng, columns, start: int) -> pa.RecordBatch:
    schema = arrow_schema(columns)
    lo, hi = copy_back._US_MIN, copy_back._US_MAX
    ts = rng.integers(lo, hi, N)
    ts[::4] = ts[::4] // 1_000_000 * 1_000_000  # whole seconds
    ts[1::4] = ts[1::4] // 1000 * 1000  # milliseconds
    ts[2::8] = rng.integers(-(10**15), 10**15, len(ts[2::8]))  # around 1970
    ts[:4] = [lo, hi, 0, -1]
    days = rng.integers(copy_back._DAY_MIN, copy_back._DAY_MAX, N)
    days[:3] = [copy_back._DAY_MIN, copy_back._DAY_MAX, 0]
    ints = rng.integers(-(2**63), 2**63 - 1, N, dtype=np.int64)
    ints[:3] = [-(2**63), 2**63 - 1, 0]
    nulls = np.arange(N) % 7 == 3
    values = {
        "s": pa.array(_texts(rng), pa.string()),
        "i": pa.array(ints, pa.int64(), mask=nulls),
        "f": pa.array(_floats(rng), pa.float64()),
        "b": pa.array(rng.integers(0, 2, N).astype(bool), pa.bool_(), mask=np.arange(N) % 5 == 1),
        "t": pa.array(ts, pa.int64(), mask=nulls).cast(pa.timestamp("us", tz="UTC")),
        "d": pa.array(days.astype(np.int32), pa.int32(), mask=np.arange(N) % 9 == 2).cast(pa.date32()),
        "j": pa.array(_docs(rng), pa.string()),
        'ünï "q"': pa.array(rng.standard_normal(N) * 1e-3, pa.float64()),
    }
    return pa.RecordBatch.from_arrays(
        [
            pa.array(range(start, start + N), pa.int64()),
            pa.array([str(uuid.uuid4()) for _ in range(N)]),
            pa.array(rng.integers(0, 2 * 10**15, N), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            *(values[c.name] for c in columns),
        ],
        schema=schema,
    )


def _native_overwrite(conn, dsn, settings, d, batch) -> None:
    catalog = load_catalog(settings, dsn)
    dataset = datasets.get_dataset(conn, d)

    def iceberg_write(sync_id, source_version):
        plan = TableWrite("replace", sync_id, source_version, path="native", max_row_index=N - 1)
        return write_native_table(catalog, settings, dataset, [batch], plan, conn=conn)

    route_write(
        conn,
        FlagResolver(conn, ttl_seconds=0),
        "sync.full",
        d,
        pg_write=lambda: pytest.fail("pg path"),
        iceberg_write=iceberg_write,
        settings=settings,
    )


def _native_dataset(conn, dsn, settings, batch_of) -> uuid.UUID:
    d = datasets.create_dataset(conn, datasets.create_workspace(conn, "ws"), "every_type", EVERY_TYPE)
    datasets.insert_rows(conn, d, [{"s": "x", "i": 1, "f": 0.5, "t": "2024-01-01T00:00:00+00:00", "j": {"a": 1}}])
    runbook_ready(conn, dsn, settings, d)  # its maintained digest registered and filled: the canary ran
    cli("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(d), check=True)
    _native_overwrite(conn, dsn, settings, d, batch_of(datasets.get_dataset(conn, d).columns))
    return d


def _written(conn, d) -> tuple[list, list]:
    rows = conn.execute(
        "select row_index, row_id, created_at, data::text, data from dataset_rows where dataset_id = %s"
        " order by row_index",
        (d,),
    ).fetchall()
    digest = conn.execute(
        "select seg, sum(n), sum(s) from lakehouse_pg_digest_deltas where dataset_id = %s group by seg"
        " having sum(n) <> 0 or sum(s) <> 0 order by seg",
        (d,),
    ).fetchall()
    return rows, digest


def _both_paths(conn, dsn, settings, d, monkeypatch) -> tuple[tuple, tuple, list]:
    """(rows and digest as the client-built COPY wrote them, as the staging path wrote them, the COPY's batches)"""
    catalog = load_catalog(settings, dsn)
    built: list[int] = []
    real = reverse.rows_batches

    def spy(*a, **kw):
        for b in real(*a, **kw):
            built.append(b.num_rows)
            yield b

    monkeypatch.setattr(reverse, "rows_batches", spy)
    r = apply_reverse(dsn, catalog, settings, d)
    assert r.how == "full" and r.copied == N and r.pg_rows == N, r
    _digest_is_exact(conn, d)
    fast = _written(conn, d)
    monkeypatch.setattr(reverse, "client_jsonb_supported", lambda *a: False)
    r = apply_reverse(dsn, catalog, settings, d, full=True)
    assert r.how == "full" and r.copied == N, r
    _digest_is_exact(conn, d)
    return fast, _written(conn, d), built


def _assert_same(fast, staged) -> None:
    (rows_a, digest_a), (rows_b, digest_b) = fast, staged
    assert len(rows_a) == len(rows_b) == N
    for a, b in zip(rows_a, rows_b, strict=True):
        assert a[:4] == b[:4], (a, b)  # identity, and data as text: numeric scale, every value
    assert digest_a == digest_b  # the maintained digest, segment by segment


def test_the_client_built_jsonb_is_the_staging_paths_value_for_value(conn, dsn, settings, monkeypatch):
    rng = np.random.default_rng(31)
    d = _native_dataset(conn, dsn, settings, lambda cols: _batch(rng, cols, 0))
    fast, staged, built = _both_paths(conn, dsn, settings, d, monkeypatch)
    assert sum(built) == N  # the first apply took the client-built COPY
    _assert_same(fast, staged)
    # and as jsonb (equality of the values, whatever their text)
    assert conn.execute(
        "select count(*) from (select data from dataset_rows where dataset_id = %s) x", (d,)
    ).fetchone() == (N,)
    sample = [r[4] for r in fast[0][:50]]
    assert all(isinstance(v, dict) and set(v) == {c["name"] for c in EVERY_TYPE} for v in sample)


def test_values_the_client_cannot_write_as_postgres_does_take_the_staging_path(
    conn, dsn, settings, monkeypatch, caplog
):
    rng = np.random.default_rng(7)

    def braced_id(cols):  # a row id uuid_in reads but not in the canonical form the client decodes
        batch = _batch(rng, cols, 0)
        ids = batch.column("__row_id").to_pylist()
        ids[5] = "{" + ids[5].replace("-", "").upper() + "}"
        return batch.set_column(1, "__row_id", pa.array(ids, pa.string()))

    d = _native_dataset(conn, dsn, settings, braced_id)
    with caplog.at_level(logging.INFO, logger="lakehouse_dagster.mirror.reverse"):
        fast, staged, _ = _both_paths(conn, dsn, settings, d, monkeypatch)
    assert "staged, not built client-side (a row id not in the canonical" in caplog.text
    _assert_same(fast, staged)


def test_timestamps_and_dates_outside_years_1_to_9999_are_refused():
    ts = pa.array([0, copy_back._US_MAX + 1], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    with pytest.raises(ClientJsonbUnsupported, match="outside years"):
        copy_back._value_texts(datasets.Column("t", "timestamp"), ts)
    days = pa.array([copy_back._DAY_MIN - 1], pa.int32()).cast(pa.date32())
    with pytest.raises(ClientJsonbUnsupported, match="outside years"):
        copy_back._value_texts(datasets.Column("d", "date"), days)


@pytest.mark.parametrize(
    "text",
    [
        '1, "x": 2',
        '{"a": 1}, "x": 2',
        "[1, 2",
        '{"a": 1]',
        '"abc',
        '"a", "b": 1',
        "1 } , { ",
        "\\",
        "[[[[[[[1]]]]]]",
        "[" * 10 + "]" * 10,
    ],
)
def test_a_json_value_that_could_reach_outside_itself_is_refused(text):
    with pytest.raises(ClientJsonbUnsupported):
        copy_back._json_value_guard(pa.array([text, "1"], pa.string()))


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, {"b": "}, \\""}], "c": {}}',
        "[]",
        '"x,y:}"',
        " 12 ",
        "null",
        "[[[[[[1]]]]]]",  # deeper than the one-pass regex: the masked check takes it
        '{"a": [{"b": [{"c": [1, "]", {"d": "\\\\"}]}]}]}',
    ],
)
def test_a_json_value_passes_the_guard(text):
    copy_back._json_value_guard(pa.array([text, None], pa.string()))


def test_a_paced_resync_pauses_between_slices_and_writes_the_same_rows(conn, dsn, settings, monkeypatch):
    """LAKEHOUSE_REVERSE_RESYNC_SHARE below 1: the COPY goes in slices with a pause after each, in its transaction;
    the rows, the identity and the digest are the unpaced re-sync's."""
    rng = np.random.default_rng(5)
    d = _native_dataset(conn, dsn, settings, lambda cols: _batch(rng, cols, 0))
    catalog = load_catalog(settings, dsn)
    assert apply_reverse(dsn, catalog, settings, d).how == "full"
    unpaced = _written(conn, d)
    pauses: list[float] = []
    slices: list[int] = []
    real = copy_back.paced

    def spy(batches, share):
        assert share == 0.5  # the setting reaches the COPY
        for b in real(batches, share, sleep=pauses.append):
            slices.append(b.num_rows)
            yield b

    monkeypatch.setattr(copy_back, "PACED_SLICE_ROWS", 500)
    monkeypatch.setattr(reverse, "paced", spy)
    r = apply_reverse(dsn, catalog, settings.replace(reverse={"resync_share": 0.5}), d, full=True)
    assert r.how == "full" and r.copied == N and r.pg_rows == N, r
    assert slices == [500] * (N // 500) and len(pauses) == len(slices)
    assert all(p >= 0 for p in pauses) and sum(pauses) > 0
    _digest_is_exact(conn, d)
    _assert_same(_written(conn, d), unpaced)


def test_paced_takes_its_share_of_the_time():
    """After a slice its consumer took T seconds over, the pause is T × (1/share − 1); share 1 passes through."""
    now = [0.0]
    batch = pa.RecordBatch.from_pydict({"x": list(range(20_000))})
    pauses: list[float] = []
    got = []
    for b in copy_back.paced(iter([batch]), 0.25, sleep=pauses.append, clock=lambda: now[0]):
        got.append(b.num_rows)
        now[0] += 2.0  # the consumer's work on the slice
    assert got == [8192, 8192, 3616]
    assert pauses == [6.0, 6.0, 6.0]  # 2 s × (1/0.25 − 1)
    passed = list(copy_back.paced(iter([batch]), 1.0, sleep=pauses.append))
    assert [b.num_rows for b in passed] == [20_000] and len(pauses) == 3


def test_the_resync_share_is_read_from_the_env_and_a_bad_one_is_refused(monkeypatch):
    from lakehouse_dagster.core.errors import BadInput
    from lakehouse_dagster.core.settings import Settings

    monkeypatch.setenv("LAKEHOUSE_REVERSE_RESYNC_SHARE", "0.3")
    assert Settings.from_env().reverse.resync_share == 0.3
    monkeypatch.delenv("LAKEHOUSE_REVERSE_RESYNC_SHARE")
    assert Settings.from_env().reverse.resync_share == 1.0  # unpaced unless asked
    for bad in ("0", "1.5", "-1"):
        monkeypatch.setenv("LAKEHOUSE_REVERSE_RESYNC_SHARE", bad)
        with pytest.raises(BadInput, match=f"LAKEHOUSE_REVERSE_RESYNC_SHARE={float(bad)} is not a share of the time"):
            Settings.from_env()
