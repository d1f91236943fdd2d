"""Postgres' own 64-bit text hash, ``hashtextextended(t, 0)``, compiled for DuckDB and Python.

Why this hash: the row hash has to be computed by both engines. The only hashes both have built in
are md5 and sha256, and md5 alone cost ~0.9× the time DuckDB needs to read and cast every column
(bench/bench_parity.py), so an md5 digest could not reach half the read speed. Postgres' internal
hash (Bob Jenkins' lookup3, ``hash_bytes_extended`` in src/common/hashfn.c; the one hash
partitioning relies on, unchanged since Postgres 11) is ~16% cheaper than md5 inside Postgres, and
this numba kernel computes the same bits at ~1.7 GB/s per core, called by DuckDB once per vector of
rows as an Arrow UDF (no Python object per row).

What ties the two together is checked, not assumed: ``PgSide.self_check`` compares the server's
hashtextextended with this kernel on awkward strings before every evaluation, so a server whose hash
differs (a big-endian machine, a future Postgres) makes the digest unavailable instead of wrong.
Postgres is called with ``COLLATE "C"`` so the bytes are hashed whatever the database collation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from numba import njit, uint32, uint64

DUCK_FUNCTION = "lakehouse_hashtext"


@njit(inline="always")
def _rot(x, k):
    return uint32((x << uint32(k)) | (x >> uint32(32 - k)))


@njit(inline="always")
def _word(d, i):  # four bytes, little-endian (what Postgres reads on the machines it hashes for us)
    return (
        uint32(d[i])
        | (uint32(d[i + 1]) << uint32(8))
        | (uint32(d[i + 2]) << uint32(16))
        | (uint32(d[i + 3]) << uint32(24))
    )


@njit(cache=True, nogil=True)
def _hash_bytes(d, i, n):
    """hash_bytes_extended(k, n, seed 0): the mix/final rounds of lookup3, verbatim."""
    a = uint32(uint32(0x9E3779B9) + uint32(n) + uint32(3923095))
    b = a
    c = a
    while n >= 12:
        a = uint32(a + _word(d, i))
        b = uint32(b + _word(d, i + 4))
        c = uint32(c + _word(d, i + 8))
        a = uint32(a - c)
        a ^= _rot(c, 4)
        c = uint32(c + b)  # noqa: E702
        b = uint32(b - a)
        b ^= _rot(a, 6)
        a = uint32(a + c)  # noqa: E702
        c = uint32(c - b)
        c ^= _rot(b, 8)
        b = uint32(b + a)  # noqa: E702
        a = uint32(a - c)
        a ^= _rot(c, 16)
        c = uint32(c + b)  # noqa: E702
        b = uint32(b - a)
        b ^= _rot(a, 19)
        a = uint32(a + c)  # noqa: E702
        c = uint32(c - b)
        c ^= _rot(b, 4)
        b = uint32(b + a)  # noqa: E702
        i += 12
        n -= 12
    # the last 0..11 bytes (the lowest byte of c is reserved for the length)
    if n >= 11:
        c = uint32(c + (uint32(d[i + 10]) << uint32(24)))
    if n >= 10:
        c = uint32(c + (uint32(d[i + 9]) << uint32(16)))
    if n >= 9:
        c = uint32(c + (uint32(d[i + 8]) << uint32(8)))
    if n >= 8:
        b = uint32(b + (uint32(d[i + 7]) << uint32(24)))
    if n >= 7:
        b = uint32(b + (uint32(d[i + 6]) << uint32(16)))
    if n >= 6:
        b = uint32(b + (uint32(d[i + 5]) << uint32(8)))
    if n >= 5:
        b = uint32(b + uint32(d[i + 4]))
    if n >= 4:
        a = uint32(a + (uint32(d[i + 3]) << uint32(24)))
    if n >= 3:
        a = uint32(a + (uint32(d[i + 2]) << uint32(16)))
    if n >= 2:
        a = uint32(a + (uint32(d[i + 1]) << uint32(8)))
    if n >= 1:
        a = uint32(a + uint32(d[i]))
    c ^= b
    c = uint32(c - _rot(b, 14))  # noqa: E702
    a ^= c
    a = uint32(a - _rot(c, 11))  # noqa: E702
    b ^= a
    b = uint32(b - _rot(a, 25))  # noqa: E702
    c ^= b
    c = uint32(c - _rot(b, 16))  # noqa: E702
    a ^= c
    a = uint32(a - _rot(c, 4))  # noqa: E702
    b ^= a
    b = uint32(b - _rot(a, 14))  # noqa: E702
    c ^= b
    c = uint32(c - _rot(b, 24))  # noqa: E702
    return (uint64(b) << uint64(32)) | uint64(c)


@njit(cache=True, nogil=True)
def _hash_all(data, offsets, out):
    for r in range(out.shape[0]):
        out[r] = _hash_bytes(data, offsets[r], offsets[r + 1] - offsets[r])


def hash_array(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """int64 hashes of a non-null Arrow string array, as Postgres' hashtextextended(t, 0) returns them."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise ValueError("hashtext: a NULL text has no hash (the canonical row text is never NULL)")
    if arr.type == pa.string() or arr.type == pa.binary():
        offset_type: Any = np.int32
    elif arr.type == pa.large_string() or arr.type == pa.large_binary():
        offset_type = np.int64
    else:
        arr, offset_type = arr.cast(pa.large_string()), np.int64
    out = np.empty(len(arr), dtype=np.uint64)
    if len(arr):
        _, offsets_buf, data_buf = arr.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=offset_type)[arr.offset : arr.offset + len(arr) + 1]
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(1, np.uint8)
        _hash_all(data, offsets, out)
    return out.view(np.int64)


def hash_text(text: str) -> int:
    """The hash of one text (the Python reference, for tests and triage)."""
    return int(hash_array(pa.array([text], pa.string()))[0])


def _duck_udf(arr):
    return pa.array(hash_array(arr), pa.int64())


def register(con) -> None:
    """Make ``lakehouse_hashtext(VARCHAR) -> BIGINT`` callable in this DuckDB connection."""
    import duckdb  # lazy: DuckDB (~0.3 s to import) only where a digest runs

    con.create_function(
        DUCK_FUNCTION,
        _duck_udf,
        [duckdb.sqltype("VARCHAR")],
        duckdb.sqltype("BIGINT"),
        type="arrow",
        null_handling="special",
        side_effects=False,
    )
