"""The pgoutput logical replication protocol (version 1, text tuples), as the SQL interface
(``pg_logical_slot_peek_binary_changes``) returns it: one message per row.

Only what the digest consumer needs: Begin, Commit, Relation, Insert, Update, Delete, Truncate, and logical
decoding Messages (``pg_logical_emit_message``; sent only when the peek asks for ``messages 'true'``, PG 14+: the
reverse mirror marks its transactions with one, tracking/capture/consumer.py); the other kinds (Type, Origin) are returned
as ``Other``. A column value is text, None (SQL null) or UNCHANGED (an unchanged TOASTed value the message leaves
out).
Reference: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import dataclasses
import struct

from lakehouse_dagster.tracking.errors import ProtocolError

UNCHANGED = object()  # 'u': an unchanged TOASTed value, not sent

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


@dataclasses.dataclass(frozen=True)
class Begin:
    final_lsn: int
    xid: int


@dataclasses.dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int


@dataclasses.dataclass(frozen=True)
class Relation:
    relid: int
    namespace: str
    name: str
    columns: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Change:
    kind: str  # "I" | "U" | "D"
    relid: int
    old: tuple | None  # the old tuple (U, D): with REPLICA IDENTITY FULL every column; else the key
    old_is_key: bool  # the old tuple holds the key columns only ('K')
    new: tuple | None  # the new tuple (I, U)


@dataclasses.dataclass(frozen=True)
class Truncate:
    relids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Message:
    transactional: bool  # emitted with transactional = true: sent inside its transaction, only if it commits
    lsn: int
    prefix: str
    content: bytes


@dataclasses.dataclass(frozen=True)
class Other:
    kind: str


def _string(buf: bytes, at: int) -> tuple[str, int]:
    end = buf.index(b"\0", at)
    return buf[at:end].decode(), end + 1


def _tuple(buf: bytes, at: int) -> tuple[tuple, int]:
    (n,) = _I16.unpack_from(buf, at)
    at += 2
    values: list = []
    for _ in range(n):
        kind = buf[at : at + 1]
        at += 1
        if kind == b"t":
            (size,) = _I32.unpack_from(buf, at)
            at += 4
            values.append(buf[at : at + size].decode())
            at += size
        elif kind == b"n":
            values.append(None)
        elif kind == b"u":
            values.append(UNCHANGED)
        else:
            raise ProtocolError(f"tuple column kind {kind!r} (binary tuples are not requested)")
    return tuple(values), at


def parse(buf: bytes):
    """One pgoutput message."""
    kind = buf[:1]
    if kind == b"B":
        return Begin(_U64.unpack_from(buf, 1)[0], _U32.unpack_from(buf, 17)[0])
    if kind == b"C":
        return Commit(_U64.unpack_from(buf, 2)[0], _U64.unpack_from(buf, 10)[0])
    if kind == b"R":
        (relid,) = _U32.unpack_from(buf, 1)
        namespace, at = _string(buf, 5)
        name, at = _string(buf, at)
        at += 1  # replica identity setting
        (n,) = _I16.unpack_from(buf, at)
        at += 2
        cols = []
        for _ in range(n):
            at += 1  # flags
            col, at = _string(buf, at)
            at += 8  # type oid, type modifier
            cols.append(col)
        return Relation(relid, namespace, name, tuple(cols))
    if kind == b"I":
        (relid,) = _U32.unpack_from(buf, 1)
        if buf[5:6] != b"N":
            raise ProtocolError("insert without a new tuple")
        new, _ = _tuple(buf, 6)
        return Change("I", relid, None, False, new)
    if kind == b"U":
        (relid,) = _U32.unpack_from(buf, 1)
        at, old, is_key = 5, None, False
        if buf[at : at + 1] in (b"K", b"O"):
            is_key = buf[at : at + 1] == b"K"
            old, at = _tuple(buf, at + 1)
        if buf[at : at + 1] != b"N":
            raise ProtocolError("update without a new tuple")
        new, _ = _tuple(buf, at + 1)
        return Change("U", relid, old, is_key, new)
    if kind == b"D":
        (relid,) = _U32.unpack_from(buf, 1)
        tag = buf[5:6]
        if tag not in (b"K", b"O"):
            raise ProtocolError("delete without an old tuple")
        old, _ = _tuple(buf, 6)
        return Change("D", relid, old, tag == b"K", None)
    if kind == b"T":
        (n,) = _I32.unpack_from(buf, 1)
        return Truncate(tuple(_U32.unpack_from(buf, 6 + 4 * i)[0] for i in range(n)))
    if kind == b"M":  # flags (1 = transactional), LSN, prefix, content length, content (protocol version 1)
        (lsn,) = _U64.unpack_from(buf, 2)
        prefix, at = _string(buf, 10)
        (size,) = _I32.unpack_from(buf, at)
        return Message(buf[1] & 1 == 1, lsn, prefix, buf[at + 4 : at + 4 + size])
    return Other(kind.decode("latin-1"))


def lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_int(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)
