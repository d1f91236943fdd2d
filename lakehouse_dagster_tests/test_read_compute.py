"""Issue 43's foundation: one structured read request, two executors (Postgres over dataset_rows, DuckDB over the
Iceberg snapshot the real mirror wrote), proven to give identical answers over generated requests on an awkward
dataset; and each refusal."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import uuid
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.lake.reader import load_dataset_table
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.routing.compute import compare
from lakehouse_dagster.routing.iceberg_compute import CannotServe, read_iceberg_compute
from lakehouse_dagster.routing.pg_compute import read_postgres_compute
from lakehouse_dagster.routing.request import Query, bind, json_schema_text, parse_query
from lakehouse_dagster.tracking import datasets

SCHEMA = [
    {"name": "s", "type": "string"},
    {"name": "g", "type": "string"},
    {"name": "i", "type": "int64"},
    {"name": "f", "type": "float64"},
    {"name": "b", "type": "boolean"},
    {"name": "ts", "type": "timestamp"},
    {"name": "d", "type": "date"},
    {"name": "j", "type": "json"},
]
TYPES = {c["name"]: c["type"] for c in SCHEMA} | {
    "__row_index": "int64",
    "__row_id": "string",
    "__created_at": "timestamp",
}

STRINGS = ["", "a", "B", "é", "ünïcödé ✓ 🦆", "中文", "z", "a|b", "Z "]
GROUPS = ["x", "y", "é", "🦆", None]
INTS = [-(2**63), 2**63 - 1, 2**63 - 1, 0, -1, 1, 42, -(2**62), 2**53 + 1]
FLOATS = [
    "NaN",
    "Infinity",
    "-Infinity",
    -0.0,
    0.0,
    0.1,
    -0.1,
    1e308,
    1.7976931348623157e308,
    5e-324,
    1e-300,
    3.5,
    -2.5,
]
TIMESTAMPS = [
    "1970-01-01T00:00:00Z",
    "1969-12-31T23:59:59.999999Z",
    "1970-01-01T00:00:00.000001+00:00",
    "2024-03-31T01:59:59+01:00",  # Europe's DST change, written with its offsets
    "2024-03-31T03:00:00+02:00",
    "2024-10-27T02:30:00+02:00",
    "2024-10-27T02:30:00+01:00",
    "2024-03-10T12:34:56.123456",  # no offset: UTC, as the mirror reads it
    "1900-01-01T00:00:00Z",
]
DATES = ["1900-01-01", "1969-12-31", "1970-01-01", "2024-02-29", "9999-12-31"]
JSONS = [{"a": 1}, [1, "two"], "text", 12345678901234567890, {}, {"b": [True, None]}, 1.5]


def _row(rng: random.Random) -> dict:
    def maybe(values, p_null=0.15, p_missing=0.05):
        r = rng.random()
        if r < p_missing:
            return ...
        if r < p_missing + p_null:
            return None
        return rng.choice(values)

    row = {
        "s": maybe(STRINGS),
        "g": rng.choice(GROUPS),
        "i": maybe(INTS),
        "f": maybe(FLOATS),
        "b": maybe([True, False]),
        "ts": maybe(TIMESTAMPS),
        "d": maybe(DATES),
        "j": maybe(JSONS),
    }
    return {k: v for k, v in row.items() if v is not ...}


@pytest.fixture
def corpus(conn, dsn, settings):
    """The awkward dataset, mirrored in three syncs (three data files, disjoint __row_index ranges)."""
    rng = random.Random(43)
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "awkward", SCHEMA)
    catalog = load_catalog(settings, dsn)
    for n in (30, 30, 15):
        datasets.insert_rows(conn, d, [_row(rng) for _ in range(n)])
        result = sync_dataset(dsn, catalog, settings, d)
    table = load_dataset_table(catalog, settings, d)
    ids = [r[0] for r in conn.execute("select row_id::text from dataset_rows where dataset_id = %s", (d,))]
    return datasets.get_dataset(conn, d), table, result.snapshot_id, ids


def both(conn, corpus, body: dict):
    dataset, table, snapshot_id, _ = corpus
    plan = bind(parse_query(body), dataset)
    pg = read_postgres_compute(conn, dataset, plan)
    ice = read_iceberg_compute(table, snapshot_id, plan, threads=1)
    return plan, pg, ice


def assert_equal(conn, corpus, body: dict):
    plan, pg, ice = both(conn, corpus, body)
    diff = compare(pg, ice, plan.ordered)
    assert diff is None, f"{body}: {diff}"
    return pg


# --- generated requests ----------------------------------------------------------------------------------------

COLUMNS = list(TYPES)
_ISO = {"timestamp": TIMESTAMPS + ["2024-10-27T01:30:00Z"], "date": DATES}


def values_of(typ: str, ids: list[str]):
    pools = {
        "string": STRINGS + [g for g in GROUPS if g],
        "int64": INTS + [0, 5, 30, 74, 75],
        "float64": FLOATS + [2, -1e308],
        "boolean": [True, False],
        "json": ['{"a": 1}', '[1, "two"]', '"text"', "{}", "1.5"],
    }
    if typ in _ISO:
        return st.sampled_from(_ISO[typ])
    return st.sampled_from(pools[typ])


def predicates(ids):
    def leaf():
        def cmp(col):
            typ = "string" if col == "__row_id" else TYPES[col]
            vals = st.sampled_from(ids) if col == "__row_id" else values_of(typ, ids)
            return st.one_of(
                st.builds(
                    lambda op, v: {"op": op, "column": col, "value": v},
                    st.sampled_from(["eq", "ne", "lt", "le", "gt", "ge"]),
                    vals,
                ),
                st.builds(lambda vs: {"op": "in", "column": col, "values": vs}, st.lists(vals, min_size=1, max_size=4)),
                st.builds(lambda op: {"op": op, "column": col}, st.sampled_from(["is_null", "not_null"])),
            )

        return st.sampled_from(COLUMNS).flatmap(cmp)

    return st.recursive(
        leaf(),
        lambda kids: st.one_of(
            st.builds(
                lambda op, a: {"op": op, "args": a},
                st.sampled_from(["and", "or"]),
                st.lists(kids, min_size=1, max_size=3),
            ),
            st.builds(lambda a: {"op": "not", "arg": a}, kids),
        ),
        max_leaves=5,
    )


def _measure(col_fn):
    col, fn = col_fn
    return {"fn": fn} if col is None else {"fn": fn, "column": col}


MEASURES = [(None, "count")] + [
    (c, fn)
    for c, t in TYPES.items()
    for fn in ("count", "count_distinct", "min", "max") + (("sum", "avg") if t in ("int64", "float64") else ())
]


def requests(ids):
    addressing = st.fixed_dictionaries(
        {},
        optional={
            "row_index": st.lists(
                st.tuples(st.integers(-2, 80), st.integers(0, 12)).map(lambda t: [t[0], t[0] + t[1]]),
                min_size=1,
                max_size=3,
            ),
            "row_ids": st.lists(st.sampled_from(ids + [str(uuid.UUID(int=7))]), min_size=1, max_size=5),
        },
    )
    rows = st.fixed_dictionaries(
        {},
        optional={
            "columns": st.lists(st.sampled_from(COLUMNS), min_size=1, max_size=4, unique=True),
            "where": predicates(ids),
            "order": st.one_of(
                st.just("row_index"),
                st.lists(
                    st.builds(lambda c, d: {"column": c, "desc": d}, st.sampled_from(COLUMNS), st.booleans()),
                    min_size=1,
                    max_size=2,
                ),
            ),
            "limit": st.integers(0, 40),
        },
    )
    keyset = st.fixed_dictionaries(
        {"after_row_index": st.integers(-1, 80), "limit": st.integers(1, 30)},
        optional={
            "where": predicates(ids),
            "columns": st.lists(st.sampled_from(COLUMNS), min_size=1, max_size=3, unique=True),
        },
    )
    aggregate = st.fixed_dictionaries(
        {
            "aggregate": st.fixed_dictionaries(
                {
                    "group_by": st.lists(st.sampled_from(COLUMNS), max_size=2, unique=True),
                    "measures": st.lists(st.sampled_from(MEASURES), min_size=1, max_size=4, unique=True).map(
                        lambda ms: [_measure(m) for m in ms]
                    ),
                }
            )
        },
        optional={"where": predicates(ids), "limit": st.integers(0, 10)},
    )
    return st.tuples(st.one_of(rows, keyset, aggregate), addressing).map(lambda t: t[0] | t[1])


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
@given(data=st.data())
def test_the_two_executors_give_identical_answers(conn, corpus, data):
    body = data.draw(requests(corpus[3]))
    got = assert_equal(conn, corpus, body)
    kind = "aggregate" if "aggregate" in body else "keyset" if "after_row_index" in body else "rows"
    event(f"{kind}: {'empty' if got.num_rows == 0 else 'some rows'}")


# --- pinned cases: each awkward value where it bites -----------------------------------------------------------


def test_a_dashboard_aggregate_is_exact_on_both(conn, corpus):
    pg = assert_equal(
        conn,
        corpus,
        {
            "where": {"op": "not_null", "column": "g"},
            "aggregate": {
                "group_by": ["g"],
                "measures": [
                    {"fn": "count"},
                    {"fn": "sum", "column": "f"},
                    {"fn": "avg", "column": "f"},
                    {"fn": "sum", "column": "i"},
                    {"fn": "avg", "column": "i"},
                ],
            },
        },
    )
    assert pg.column_names == ["g", "count", "sum_f", "avg_f", "sum_i", "avg_i"]
    assert str(pg.schema.field("sum_i").type) == "decimal128(38, 0)"
    assert pg.column("g").to_pylist() == sorted(pg.column("g").to_pylist(), key=lambda s: s.encode())  # bytewise


def test_exact_float_sum_where_float_addition_is_not():
    """The engines sum parts exactly; float addition in any order gives 0.0 or 2.0 here, the exact sum is 2.0."""
    from lakehouse_dagster.routing.compute import _exact_float

    def parts(x: float) -> tuple[int, int]:
        import struct

        b = struct.unpack(">q", struct.pack(">d", x))[0]
        ex, frac = (b >> 52) & 2047, b & ((1 << 52) - 1)
        e = max(ex, 1) - 1075 + 1080
        m = (frac + ((1 << 52) if ex else 0)) << (e % 8)
        return e // 8, -m if b < 0 else m

    total = sum(m << (8 * k) for k, m in map(parts, [1e308, 2.0, -1e308]))
    assert _exact_float([total, 0, 0, 0], 1) == 2.0
    assert 1e308 + 2.0 - 1e308 == 0.0
    # the overflow edge, as IEEE rounds: below the halfway point to 2^1024 the largest float, from it ±Infinity
    edge = (2**1024 - 2**970) << 1080
    assert _exact_float([edge - 1, 0, 0, 0], 1) == 1.7976931348623157e308
    assert _exact_float([edge, 0, 0, 0], 1) == math.inf
    assert _exact_float([-edge, 0, 0, 0], 1) == -math.inf
    assert _exact_float([edge, 0, 0, 0], 2) == 2.0**1023  # an average divides before it rounds


def test_int64_sums_do_not_overflow(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "big", [{"name": "i", "type": "int64"}])
    datasets.insert_rows(conn, d, [{"i": 2**63 - 1}] * 3)
    catalog = load_catalog(settings, dsn)
    snap = sync_dataset(dsn, catalog, settings, d).snapshot_id
    dataset, table = datasets.get_dataset(conn, d), load_dataset_table(catalog, settings, d)
    plan = bind(
        parse_query({"aggregate": {"measures": [{"fn": "sum", "column": "i"}, {"fn": "avg", "column": "i"}]}}), dataset
    )
    pg, ice = read_postgres_compute(conn, dataset, plan), read_iceberg_compute(table, snap, plan)
    assert compare(pg, ice, True) is None
    assert pg.to_pylist() == [{"sum_i": 3 * (2**63 - 1), "avg_i": float(2**63 - 1)}]


def test_a_float_sum_beyond_float64_is_infinity_on_both(conn, dsn, settings):
    """Regression (the property test found it: ``group_by s, sum f`` over 1e308 and 1.797e308 in one group): a float
    sum whose exact value is beyond float64 rounds to ±Infinity, as IEEE rounds an overflow, on both engines — it
    raised OverflowError in the shared finishing. Summed exactly, finite parts that cancel do not overflow."""
    big, top = 1e308, 1.7976931348623157e308
    groups = {
        "over": [big, top],  # exact 2.797e308: +Infinity
        "under": [-big, -big],  # -Infinity
        "cancels": [big, big, -big],  # exact 1e308: float addition in this order would overflow first
        "max": [top, 5e-324],  # rounds to the largest float64, not to Infinity
    }
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "huge", [{"name": "s", "type": "string"}, {"name": "f", "type": "float64"}])
    datasets.insert_rows(conn, d, [{"s": s, "f": f} for s, fs in groups.items() for f in fs])
    catalog = load_catalog(settings, dsn)
    snap = sync_dataset(dsn, catalog, settings, d).snapshot_id
    dataset, table = datasets.get_dataset(conn, d), load_dataset_table(catalog, settings, d)
    body = {"aggregate": {"group_by": ["s"], "measures": [{"fn": "sum", "column": "f"}, {"fn": "avg", "column": "f"}]}}
    plan = bind(parse_query(body), dataset)
    pg, ice = read_postgres_compute(conn, dataset, plan), read_iceberg_compute(table, snap, plan)
    assert compare(pg, ice, True) is None
    exact_avg = {s: float(sum(map(Fraction, fs)) / len(fs)) for s, fs in groups.items()}  # rounded once
    assert {r["s"]: (r["sum_f"], r["avg_f"]) for r in pg.to_pylist()} == {
        "cancels": (big, exact_avg["cancels"]),
        "max": (top, exact_avg["max"]),
        "over": (math.inf, exact_avg["over"]),  # the average is finite: divided once, after the exact sum
        "under": (-math.inf, -big),
    }


def test_keyset_pages_walk_the_dataset_in_order(conn, corpus):
    seen, after = [], -1
    while True:
        page = assert_equal(conn, corpus, {"after_row_index": after, "limit": 7, "columns": ["__row_index", "f"]})
        if page.num_rows == 0:
            break
        seen += page.column("__row_index").to_pylist()
        after = seen[-1]
    assert seen == list(range(75))


def test_keyset_pages_read_a_sorted_row_group_batch_by_batch(conn, corpus, monkeypatch):
    """Batches of 4 rows: a page starts mid-batch, spans batches, stops in one; with a filter too."""
    from lakehouse_dagster.routing import iceberg_compute

    monkeypatch.setattr(iceberg_compute, "PAGE_BATCH_ROWS", 4)
    sorted_reads = []
    original = iceberg_compute._Files._from_row
    monkeypatch.setattr(
        iceberg_compute._Files, "_from_row", lambda self, *a: sorted_reads.append(a[-1]) or original(self, *a)
    )
    for where in (None, {"op": "not_null", "column": "f"}):
        seen, after = [], -1
        while True:
            body = {"after_row_index": after, "limit": 5, "columns": ["__row_index", "f", "s"]}
            page = assert_equal(conn, corpus, body | ({"where": where} if where else {}))
            if page.num_rows == 0:
                break
            seen += page.column("__row_index").to_pylist()
            after = seen[-1] + (where is None)  # unfiltered: skip a row now and then (a page that starts mid-batch)
        assert seen == sorted(seen) and len(seen) == len(set(seen)) and seen
    assert sorted_reads and any(start % 4 for start in sorted_reads)  # the batch path ran, from mid-batch rows too


def test_nan_and_infinity_match_as_postgres_compares_them(conn, corpus):
    got = assert_equal(
        conn, corpus, {"where": {"op": "gt", "column": "f", "value": 1e308}, "columns": ["f"], "order": "row_index"}
    )
    values = {str(v) for v in got.column("f").to_pylist()}
    assert values <= {"nan", "inf", "1.7976931348623157e+308"} and "nan" in values  # NaN sorts above every number


def test_timestamps_compare_as_instants(conn, corpus):
    got = assert_equal(
        conn,
        corpus,
        {"where": {"op": "eq", "column": "ts", "value": "2024-10-27T01:30:00Z"}, "columns": ["ts"]},
    )
    assert got.num_rows and set(got.column("ts").to_pylist()) == {dt.datetime(2024, 10, 27, 1, 30, tzinfo=dt.UTC)}


def test_row_ids_address_rows(conn, corpus):
    ids = corpus[3][:5]
    got = assert_equal(conn, corpus, {"row_ids": ids + [str(uuid.UUID(int=1))], "columns": ["__row_id"]})
    assert sorted(got.column("__row_id").to_pylist()) == sorted(ids)


@pytest.fixture
def small_groups(conn, dsn, settings, monkeypatch):
    """The awkward dataset mirrored in two syncs with row groups of 4 rows (the mirror's are 16,384): many row groups
    per file, each file's last one smaller."""
    import pyarrow.parquet as pq

    from lakehouse_dagster.lake import write_files

    monkeypatch.setattr(write_files, "ROW_GROUP_ROWS", 4)
    rng = random.Random(7)
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "groups", SCHEMA)
    catalog = load_catalog(settings, dsn)
    for n in (30, 15):
        datasets.insert_rows(conn, d, [_row(rng) for _ in range(n)])
        result = sync_dataset(dsn, catalog, settings, d)
    table = load_dataset_table(catalog, settings, d)
    sizes = []
    for task in table.scan(snapshot_id=result.snapshot_id).plan_files():
        with table.io.new_input(task.file.file_path).open() as f:
            meta = pq.ParquetFile(f).metadata
            sizes.append([meta.row_group(i).num_rows for i in range(meta.num_row_groups)])
            chunks = {meta.row_group(0).column(c).path_in_schema: meta.row_group(0).column(c) for c in range(8)}
            # the identity columns whose values are all distinct are written plain; the others may use a dictionary
            assert not any("DICTIONARY" in e for e in chunks["__row_id"].encodings), chunks["__row_id"].encodings
            assert not any("DICTIONARY" in e for e in chunks["__row_index"].encodings)
    assert sorted(sizes) == sorted([[4] * 7 + [2], [4] * 3 + [3]]), sizes  # whatever the batches the mirror wrote
    ids = [
        r[0]
        for r in conn.execute("select row_id::text from dataset_rows where dataset_id = %s order by row_index", (d,))
    ]
    return datasets.get_dataset(conn, d), table, result.snapshot_id, ids


def test_row_ids_and_keyset_pages_over_many_row_groups(conn, small_groups, monkeypatch):
    """row_ids read the __row_id column first and the other columns only of the row groups holding a wanted id; keyset
    pages cross row groups and files; both engines agree on every answer."""
    import pyarrow.parquet as pq

    ids = small_groups[3]
    reads: list[list[str]] = []
    original = pq.ParquetFile.read_row_group
    monkeypatch.setattr(
        pq.ParquetFile,
        "read_row_group",
        lambda self, i, columns=None, **kw: (
            reads.append(list(columns or [])) or original(self, i, columns=columns, **kw)
        ),
    )
    got = assert_equal(conn, small_groups, {"row_ids": [ids[5]], "columns": ["i", "s"]})
    assert got.num_rows == 1
    # the ids of every row group (8 + 4), the other columns of the one holding the id
    assert len(reads) == 12 + 1 and [cols for cols in reads if cols != ["__row_id"]] == [["__row_index", "i", "s"]], (
        reads
    )
    for body in (
        {"row_ids": [ids[0], ids[9], ids[10], ids[31], ids[44]]},  # several groups of both files, every column
        {"row_ids": [ids[3], ids[40]], "columns": ["__row_id"]},  # nothing read but the ids
        {"row_ids": ids[::3], "where": {"op": "not_null", "column": "f"}, "columns": ["__row_index", "f"]},
        {
            "row_ids": ids[::2],
            "aggregate": {"group_by": [], "measures": [{"fn": "count"}, {"fn": "max", "column": "i"}]},
        },
        {"row_ids": [str(uuid.UUID(int=1))]},  # no such row: an empty answer
    ):
        assert_equal(conn, small_groups, body)
    seen, after = [], -1
    while True:
        page = assert_equal(conn, small_groups, {"after_row_index": after, "limit": 6, "columns": ["__row_index", "s"]})
        if page.num_rows == 0:
            break
        seen += page.column("__row_index").to_pylist()
        after = seen[-1]
    assert seen == list(range(45))


def test_empty_groups_and_an_empty_answer(conn, corpus):
    none = {"op": "eq", "column": "i", "value": 123456789}
    got = assert_equal(
        conn, corpus, {"where": none, "aggregate": {"measures": [{"fn": "count"}, {"fn": "sum", "column": "f"}]}}
    )
    assert got.to_pylist() == [{"count": 0, "sum_f": None}]
    got = assert_equal(conn, corpus, {"where": none, "aggregate": {"group_by": ["g"], "measures": [{"fn": "count"}]}})
    assert got.num_rows == 0


# --- refusals --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"where": {"op": "eq", "column": "nope", "value": 1}}, "unknown column 'nope'"),
        ({"where": {"op": "eq", "column": 'n"; drop table datasets; --', "value": 1}}, "unknown column"),
        ({"where": {"op": "eq", "column": "i", "value": "1"}}, "is not an int64"),
        ({"where": {"op": "eq", "column": "i", "value": 2**63}}, "is not an int64"),
        ({"where": {"op": "eq", "column": "i", "value": True}}, "is not an int64"),
        ({"where": {"op": "lt", "column": "f", "value": "nan"}}, "is not a float64"),
        ({"where": {"op": "eq", "column": "f", "value": None}}, "use is_null"),
        ({"where": {"op": "eq", "column": "ts", "value": "yesterday"}}, "is not an ISO 8601 timestamp"),
        ({"where": {"op": "eq", "column": "d", "value": 19000}}, "is not a date"),
        ({"where": {"op": "like", "column": "s", "value": "%"}}, "where"),
        ({"where": {"op": "in", "column": "s", "values": []}}, "at least 1"),
        ({"where": "i > 1"}, "where"),
        ({"sql": "select 1"}, "sql: Extra inputs are not permitted"),
        ({"aggregate": {"measures": [{"fn": "sum", "column": "s"}]}}, "sum of 's' (string) is not defined"),
        ({"aggregate": {"measures": [{"fn": "avg"}]}}, "avg needs a column"),
        ({"aggregate": {"measures": []}}, "at least 1"),
        ({"aggregate": {"measures": [{"fn": "median", "column": "f"}]}}, "aggregate.measures.0.fn"),
        ({"aggregate": {"measures": [{"fn": "count"}]}, "columns": ["s"]}, "columns and aggregate do not mix"),
        ({"aggregate": {"measures": [{"fn": "count"}]}, "order": "row_index"}, "ordered by its group_by"),
        ({"aggregate": {"group_by": ["g"], "measures": [{"fn": "count", "name": "g"}]}}, "appears twice"),
        ({"after_row_index": 3, "order": [{"column": "s"}]}, "after_row_index pages in __row_index order"),
        ({"row_index": [[5, 2]]}, "is empty"),
        ({"row_ids": ["not-a-uuid"]}, "is not a row id"),
        ({"row_ids": [str(uuid.uuid4())] * 10_001}, "at most 10000"),
        ({"limit": -1}, "limit"),
        ({"limit": "10"}, "limit"),
    ],
)
@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_refusals_are_one_line(conn, corpus, body, message):
    with pytest.raises(BadInput) as err:
        bind(parse_query(body), corpus[0])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_iceberg_refuses_a_column_it_has_not_mirrored_yet(conn, corpus):
    dataset, table, snap, _ = corpus
    datasets.set_schema(conn, dataset.id, SCHEMA + [{"name": "later", "type": "int64"}])
    dataset = datasets.get_dataset(conn, dataset.id)
    plan = bind(parse_query({"aggregate": {"measures": [{"fn": "sum", "column": "later"}]}}), dataset)
    assert read_postgres_compute(conn, dataset, plan).to_pylist() == [{"sum_later": None}]
    with pytest.raises(CannotServe, match="has no column later"):
        read_iceberg_compute(table, snap, plan)


def test_the_request_schema_is_published():
    schema = Query.model_json_schema()
    assert {"where", "aggregate", "row_ids", "after_row_index", "row_index", "order"} <= set(schema["properties"])
    published = Path(__file__).resolve().parents[1] / "docs" / "reads.schema.json"
    assert published.read_text() == json_schema_text(), (
        "docs/reads.schema.json drifted from routing/request.py; regenerate it: python -c 'from "
        'lakehouse_dagster.routing.request import json_schema_text as t; print(t(), end="")\' > docs/reads.schema.json'
    )


def test_lakehouse_read_takes_a_structured_read(conn, corpus, capsys):
    from lakehouse_dagster.cli.main import main

    dataset = corpus[0]
    query = json.dumps({"aggregate": {"group_by": ["b"], "measures": [{"fn": "count"}]}})
    code = main(["read", "--reader", "export.stream", "--dataset", str(dataset.id), "--query", query])
    out = capsys.readouterr().out
    assert code == 0 and "reason=pg@off" in out and "(3 row(s) from pg)" in out  # false, true, null
    assert main(["read", "--reader", "export.stream", "--dataset", str(dataset.id), "--query", "{nope"]) == 2
    assert "--query is not valid JSON" in capsys.readouterr().err
