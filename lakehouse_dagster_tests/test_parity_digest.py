"""The digest contract: Postgres, DuckDB-over-Parquet and the Python reference agree on identical data and
disagree on any change (property-based, over every column type), plus the traps met on the way."""

from __future__ import annotations

import datetime as dt
import math
import struct
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, note
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity import canonical, lookup3
from lakehouse_dagster.parity.digest import (
    IcebergPin,
    IcebergSide,
    PgSide,
    PinnedPostgres,
    full_digest,
    pin_iceberg,
    plain_digest,
)
from lakehouse_dagster.tracking import datasets as app_tables
from lakehouse_dagster.tracking.datasets import Column

TYPES = ["string", "int64", "float64", "boolean", "timestamp", "date", "json"]
MISSING = object()

text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=10)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=6,
)
offsets = st.integers(-14 * 60, 14 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))


def _json_float(x: float):
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


VALUE = {  # each type's values as they arrive in dataset_rows.data (JSON)
    "string": text,
    "int64": st.integers(-(2**63), 2**63 - 1),
    "float64": st.floats().map(_json_float),
    "boolean": st.booleans(),
    "timestamp": st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1), timezones=offsets).map(
        lambda t: t.isoformat()
    ),
    "date": st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)).map(lambda d: d.isoformat()),
    "json": json_values,
}


@st.composite
def datasets(draw):
    pair_type = draw(st.sampled_from(TYPES))  # two columns of one type: a swap between them must show
    others = draw(st.lists(st.sampled_from(TYPES), min_size=0, max_size=4))
    types = [pair_type, *others[:1], pair_type, *others[1:]]
    names = ['we"ird |name', *[f"c{i}" for i in range(1, len(types))]]
    schema = [{"name": n, "type": t} for n, t in zip(names, types)]
    rows = []
    for _ in range(draw(st.integers(1, 8))):
        row = {}
        for n, t in zip(names, types):
            v = draw(st.one_of(st.just(MISSING), st.none(), VALUE[t], VALUE[t], VALUE[t]))
            if v is not MISSING:
                row[n] = v
        rows.append(row)
    return schema, rows, (names[0], names[2 if others else 1])


def _different(value, typ: str):
    """A value of the same type that is not equal to ``value`` (typed, as Iceberg holds it)."""
    if typ == "int64":
        return 0 if value is None else (value - 1 if value == 2**63 - 1 else value + 1)
    if typ == "float64":
        if value is None or math.isnan(value) or math.isinf(value) or value == 0:
            return 1.0 if value != 1.0 else 2.0
        return value * 2 if math.isfinite(value * 2) else value / 2
    if typ == "boolean":
        return True if value is None else not value
    if typ == "timestamp":
        return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) if value is None else value + dt.timedelta(microseconds=1)
    if typ == "date":
        return (
            dt.date(1970, 1, 1)
            if value is None
            else (value - dt.timedelta(days=1) if value.year == 9999 else value + dt.timedelta(days=1))
        )
    if typ == "string":
        return "" if value is None else value + "x"
    return "0" if value is None else "[" + value + "]"  # json text


def _iceberg_digest_of(rows: list[dict], arrow_schema: pa.Schema, fields, columns, path) -> tuple[int, int]:
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema), path)
    pin = IcebergPin(("t", "t"), snapshot_id=0, fields=fields, files=[str(path)])
    with IcebergSide(pin, columns) as side:
        lo = min([r["__row_index"] for r in rows] + [0])
        hi = max([r["__row_index"] for r in rows] + [0]) + 1
        return full_digest(side, lo, hi).value


@hsettings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
@given(data=datasets(), pick=st.data())
def test_property_identical_data_same_digest_any_change_differs(conn, dsn, settings, tmp_path, data, pick):
    schema, rows, pair = data
    ws = app_tables.create_workspace(conn, "w")
    d = app_tables.create_dataset(conn, ws, f"p-{uuid.uuid4().hex[:8]}", schema)
    app_tables.insert_rows(conn, d, rows)
    note(f"schema={schema} rows={rows}")
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d)
    columns = app_tables.get_dataset(conn, d).columns
    hi = len(rows)

    # identical data ⇒ identical digest, on both engines and in the Python reference
    pin = pin_iceberg(load_catalog(settings, dsn), settings, d)
    with PinnedPostgres(dsn) as pg, IcebergSide(pin, columns) as ice:
        pg_digest = full_digest(PgSide(pg.conn, d, columns), 0, hi)
        ice_digest = full_digest(ice, 0, hi)
        # the canary's ungrouped query gives the same as the segment sums
        assert plain_digest(PgSide(pg.conn, d, columns)).value == pg_digest.value == plain_digest(ice).value
    assert pg_digest.value == ice_digest.value
    table = pin.table.scan(snapshot_id=pin.snapshot_id).to_arrow().sort_by("__row_index")
    iceberg_rows = table.to_pylist()
    reference = sum(
        canonical.row_hash(
            canonical.canonical_row(
                r["__row_index"], r["__row_id"], r["__created_at"], [r[c.name] for c in columns], columns
            )
        )
        for r in iceberg_rows
    )
    assert (len(iceberg_rows), reference) == pg_digest.value

    fields = pin.fields
    base = (len(iceberg_rows), reference)
    r = pick.draw(st.integers(0, len(iceberg_rows) - 1), label="row")
    c = pick.draw(st.sampled_from(columns), label="column")

    # one changed value (Iceberg side) ⇒ different digest
    changed = [dict(x) for x in iceberg_rows]
    changed[r][c.name] = _different(changed[r][c.name], c.type)
    assert _iceberg_digest_of(changed, table.schema, fields, columns, tmp_path / "changed.parquet") != base
    # one dropped row ⇒ different
    dropped = iceberg_rows[:r] + iceberg_rows[r + 1 :]
    assert _iceberg_digest_of(dropped, table.schema, fields, columns, tmp_path / "dropped.parquet") != base
    # one duplicated row ⇒ different (a xor would cancel it; the sum does not)
    duplicated = iceberg_rows + [iceberg_rows[r]]
    assert _iceberg_digest_of(duplicated, table.schema, fields, columns, tmp_path / "dup.parquet") != base
    # one swapped pair of values between two columns of one row ⇒ different (when the values differ)
    a, b = pair
    typ = next(col.type for col in columns if col.name == a)
    swappable = [
        i
        for i, x in enumerate(iceberg_rows)
        if canonical.canonical_value(x[a], typ) != canonical.canonical_value(x[b], typ)
    ]
    if swappable:
        event("swap tested")
        i = swappable[0]
        swapped = [dict(x) for x in iceberg_rows]
        swapped[i][a], swapped[i][b] = swapped[i][b], swapped[i][a]
        assert _iceberg_digest_of(swapped, table.schema, fields, columns, tmp_path / "swap.parquet") != base

    # one changed value on the Postgres side (in a transaction rolled back after the digest) ⇒ different:
    # a non-null value becomes null (key dropped), a null one becomes a value
    with conn.transaction(force_rollback=True):
        conn.execute(
            "update dataset_rows set data = case when coalesce(data -> %(k)s, 'null'::jsonb) <> 'null'::jsonb"
            " then data - %(k)s else data || %(v)s end where dataset_id = %(d)s and row_index = %(r)s",
            {"k": c.name, "v": Jsonb({c.name: _json_example(c.type)}), "d": d, "r": r},
        )
        assert full_digest(PgSide(conn, d, columns), 0, hi).value != pg_digest.value


def _json_example(typ: str):
    """A non-null JSON value of the type (dropping a present key or adding this one changes the row)."""
    return {
        "string": "zz",
        "int64": 7,
        "float64": 0.5,
        "boolean": True,
        "timestamp": "2001-02-03T04:05:06Z",
        "date": "2001-02-03",
        "json": {"q": 1},
    }[typ]


# ---------------------------------------------------------------------------------------------------


AWKWARD_FLOATS = [
    0.1,
    1e-300,
    -0.0,
    0.0,
    5e-324,
    1.7976931348623157e308,
    -2.5,
    56.0,
    3.5399581018880077e17,
    123456789.123456789,
    math.nan,
    math.inf,
    -math.inf,
    2.0**-1074,
    -(2.0**1023),
]


def test_float_text_is_identical_in_postgres_duckdb_and_python(conn, tmp_path):
    want = [canonical.canonical_value(x, "float64") for x in AWKWARD_FLOATS]
    assert want[2] == want[3] == "0"  # -0.0 == 0.0: equal values, equal text
    assert want[0] == "4591870180066957722" == str(0x3FB999999999999A)  # 0.1's IEEE-754 bits
    assert want[10:13] == ["NaN", str(0x7FF0000000000000), str(-(1 << 52))]
    assert len(set(want)) == len(want) - 2  # only the zeros (and 5e-324 == 2**-1074) share a text
    v = sql.SQL("x")
    pg = conn.execute(
        sql.SQL("select {} from unnest(%s::float8[]) with ordinality u(x, o) order by o").format(
            canonical._pg_field("float64", v)
        ),
        ([str(x) if not math.isfinite(x) else repr(x) for x in AWKWARD_FLOATS],),
    ).fetchall()
    assert [r[0] for r in pg] == want
    # DuckDB over a Parquet file whose statistics leave NaN out (the folding trap: see canonical.py)
    path = tmp_path / "f.parquet"
    # plus NaNs with other bits than Postgres' (sign set, a payload): a NaN is a NaN
    other_nans = [struct.unpack(">d", struct.pack(">Q", b))[0] for b in (0xFFF8000000000000, 0x7FF0000000000001)]
    pq.write_table(pa.table({"i": list(range(len(AWKWARD_FLOATS) + 2)), "x": AWKWARD_FLOATS + other_nans}), path)
    import duckdb

    con = duckdb.connect()
    got = con.execute(
        f"select {canonical._duck_field('float64', 'x')} from read_parquet($1) order by i", [str(path)]
    ).fetchall()
    assert [r[0] for r in got] == want + ["NaN", "NaN"]
    nan_row = con.execute(
        f"select {canonical._duck_field('float64', 'x')} from read_parquet($1) where i = 10", [str(path)]
    ).fetchall()
    assert nan_row == [("NaN",)]


def test_text_fields_cannot_be_confused_with_separators():
    cols = [Column("a", "string"), Column("b", "string")]
    one = canonical.canonical_row(0, None, None, ["x|1:y", None], cols)
    two = canonical.canonical_row(0, None, None, ["x", "y|\\N"], cols)
    three = canonical.canonical_row(0, None, None, ["x|", "y"], cols)
    assert len({one, two, three}) == 3
    assert canonical.canonical_row(0, None, None, ["", None], cols) != canonical.canonical_row(
        0, None, None, [None, ""], cols
    )
    # json is unprefixed (valid JSON delimits itself); texts that are not JSON cannot borrow a "|"
    js = [Column("a", "json"), Column("b", "json")]
    postgres = canonical.canonical_row(0, None, None, ['"p|q"', "2"], js)
    assert postgres.endswith('|"p|q"|2')
    assert canonical.canonical_row(0, None, None, ['"p', 'q"|2'], js) != postgres


def test_invalid_json_text_in_iceberg_is_marked_in_duckdb(tmp_path):
    import duckdb

    path = tmp_path / "j.parquet"
    pq.write_table(pa.table({"i": [0, 1, 2], "j": ['"p', '{"a": [1, "x|y"]}', None]}), path)
    got = (
        duckdb.connect()
        .execute(f"select {canonical._duck_field('json', 'j')} from read_parquet($1) order by i", [str(path)])
        .fetchall()
    )
    assert [r[0] for r in got] == ['!2:"p', '{"a": [1, "x|y"]}', canonical.NULL]


def test_many_columns_nest_past_the_postgres_argument_limit(conn, dsn, settings):
    schema = [{"name": f"c{i}", "type": ["int64", "string", "float64"][i % 3]} for i in range(150)]
    ws = app_tables.create_workspace(conn, "w")
    d = app_tables.create_dataset(conn, ws, "wide", schema)
    app_tables.insert_rows(
        conn,
        d,
        [
            {f"c{i}": (k * i if i % 3 == 0 else (f"v{k}" if i % 3 == 1 else k / 3)) for i in range(150)}
            for k in range(5)
        ],
    )
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d)
    columns = app_tables.get_dataset(conn, d).columns
    pin = pin_iceberg(load_catalog(settings, dsn), settings, d)
    with PinnedPostgres(dsn) as pg, IcebergSide(pin, columns) as ice:
        assert full_digest(PgSide(pg.conn, d, columns), 0, 5).value == full_digest(ice, 0, 5).value


def test_a_column_absent_from_older_files_reads_as_null(conn, dsn, settings, tmp_path):
    """Iceberg reads a column added after a file was written as NULL; so does the digest (by name)."""
    ws = app_tables.create_workspace(conn, "w")
    d = app_tables.create_dataset(
        conn, ws, "evolving", [{"name": "a", "type": "int64"}, {"name": "b", "type": "string"}]
    )
    app_tables.insert_rows(conn, d, [{"a": 1}, {"a": 2, "b": "two"}])
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d)
    columns = app_tables.get_dataset(conn, d).columns
    pin = pin_iceberg(load_catalog(settings, dsn), settings, d)
    rows = pin.table.scan().to_arrow().sort_by("__row_index").to_pylist()
    old = tmp_path / "old.parquet"  # row 0 written before column b existed
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in rows[0].items() if k != "b"}]), old)
    new = tmp_path / "new.parquet"
    pq.write_table(pa.Table.from_pylist(rows[1:]), new)
    split = IcebergPin(("t", "t"), snapshot_id=0, fields=pin.fields, files=[str(old), str(new)])
    with PinnedPostgres(dsn) as pg, IcebergSide(split, columns) as ice:
        assert "b" in ice.present
        assert full_digest(PgSide(pg.conn, d, columns), 0, 2).value == full_digest(ice, 0, 2).value
    only_old = IcebergPin(("t", "t"), snapshot_id=0, fields=pin.fields, files=[str(old)])
    with IcebergSide(only_old, columns) as ice:  # no file has b at all: NULL, not an error
        assert "b" not in ice.present and full_digest(ice, 0, 1).count == 1


@pytest.mark.parametrize("width", [2, 90, 150])  # 90 and 150: the row text nests concat_ws past 90 fields
def test_a_key_the_schema_does_not_declare_changes_the_postgres_digest_only(conn, dsn, settings, width):
    """Issue 42 item 5: the digest read the declared columns only, so a key Iceberg cannot hold went unseen."""
    schema = [{"name": f"c{i}", "type": "int64"} for i in range(width)]
    ws = app_tables.create_workspace(conn, "w")
    d = app_tables.create_dataset(conn, ws, "d", schema)
    app_tables.insert_rows(conn, d, [{f"c{i}": k * i for i in range(width)} for k in range(4)])
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d)
    columns = app_tables.get_dataset(conn, d).columns
    pin = pin_iceberg(load_catalog(settings, dsn), settings, d)

    def sides():
        with PinnedPostgres(dsn) as pg, IcebergSide(pin, columns) as ice:
            pg_side = PgSide(pg.conn, d, columns)
            return (
                full_digest(pg_side, 0, 4).value,
                full_digest(ice, 0, 4).value,
                dict(pg_side.row_hashes(0, 4)),
                dict(ice.row_hashes(0, 4)),
                plain_digest(PgSide(pg.conn, d, columns, identity=False)).value,
            )

    pg_before, ice_digest, pg_rows, ice_rows, content = sides()
    assert pg_before == ice_digest and pg_rows == ice_rows  # no undeclared key: the text it always had
    conn.execute(
        'update dataset_rows set data = data || \'{"extra": {"x": 1}}\' where dataset_id = %s and row_index = 2',
        (d,),
    )
    pg_after, ice_again, pg_rows_after, _, content_after = sides()
    assert ice_again == ice_digest and pg_after != ice_digest and content_after != content
    assert [i for i in range(4) if pg_rows_after[i] != ice_rows[i]] == [2]  # localised to that row
    conn.execute("update dataset_rows set data = data - 'extra' where dataset_id = %s", (d,))
    assert sides()[0] == ice_digest


def test_server_self_check_passes(conn):
    PgSide(conn, uuid.uuid4(), []).self_check()


def test_pyiceberg_reader_path_gives_the_same_digest(conn, dsn, settings):
    """Remote files (s3://) or delete files go through pyiceberg's Arrow reader into DuckDB: same digest."""
    ws = app_tables.create_workspace(conn, "w")
    schema = [{"name": "s", "type": "string"}, {"name": "f", "type": "float64"}, {"name": "j", "type": "json"}]
    d = app_tables.create_dataset(conn, ws, "arrow", schema)
    app_tables.insert_rows(
        conn, d, [{"s": f"r{k}", "f": "NaN" if k == 3 else k / 3, "j": {"k": [k, None]}} for k in range(50)]
    )
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d)
    columns = app_tables.get_dataset(conn, d).columns
    pin = pin_iceberg(load_catalog(settings, dsn), settings, d)
    with (
        PinnedPostgres(dsn) as pg,
        IcebergSide(pin, columns, via_arrow=True) as arrow,
        IcebergSide(pin, columns) as files,
    ):
        want = full_digest(PgSide(pg.conn, d, columns), 0, 50).value
        assert full_digest(arrow, 0, 50).value == want == full_digest(files, 0, 50).value
        assert (
            sorted(arrow.row_hashes(10, 13)) == sorted(files.row_hashes(10, 13)) and len(arrow.row_hashes(10, 13)) == 3
        )


# ---------------------------------------------------------------------------------------------------
# The hash: Postgres' hashtextextended and the compiled lookup3 kernel give the same bits.


@hsettings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=60), min_size=1, max_size=30
    )
)
@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_lookup3_kernel_is_postgres_hashtextextended(conn, texts):
    pg = [
        r[0]
        for r in conn.execute(
            'select hashtextextended(t collate "C", 0) from unnest(%s::text[]) with ordinality u(t, o) order by o',
            (texts,),
        ).fetchall()
    ]
    assert [lookup3.hash_text(t) for t in texts] == pg
    # every Arrow layout DuckDB or pyarrow may hand over: 32/64-bit offsets, a slice not starting at 0
    for typ in (pa.string(), pa.large_string()):
        arr = pa.array(["pad"] + texts, typ).slice(1)
        assert lookup3.hash_array(arr).tolist() == pg


def test_lookup3_in_duckdb_matches_postgres_and_refuses_null(conn):
    import duckdb

    texts = ["", "a", "x" * 12, "x" * 13, "héllo ✓", "0|36:" + "e" * 36]
    pg = [
        r[0]
        for r in conn.execute(
            'select hashtextextended(t collate "C", 0) from unnest(%s::text[]) with ordinality u(t, o) order by o',
            (texts,),
        ).fetchall()
    ]
    con = duckdb.connect()
    lookup3.register(con)
    got = con.execute(
        f"select {lookup3.DUCK_FUNCTION}(t) from unnest($1) with ordinality u(t, o) order by o", [texts]
    ).fetchall()
    assert [r[0] for r in got] == pg
    # over more rows than one DuckDB vector, in parallel: the same as hashing them one by one
    many = con.execute(f"select sum({lookup3.DUCK_FUNCTION}(i::VARCHAR)::HUGEINT) from range(50000) t(i)").fetchone()[0]
    assert many == sum(lookup3.hash_text(str(i)) for i in range(50000))
    with pytest.raises(duckdb.Error, match="NULL text has no hash"):
        con.execute(f"select {lookup3.DUCK_FUNCTION}(NULL::VARCHAR)").fetchall()


def test_self_check_refuses_a_server_whose_hash_differs(conn, monkeypatch):
    from lakehouse_dagster.parity.digest import DigestUnavailable

    side = PgSide(conn, uuid.uuid4(), [])
    side.self_check()
    monkeypatch.setattr(lookup3, "hash_text", lambda t: 42)  # as if the server's lookup3 were another
    with pytest.raises(DigestUnavailable, match="hashtextextended differs"):
        side.self_check()
