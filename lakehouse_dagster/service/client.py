"""A small Python client of the service (httpx): what the tests, the bench and a Python caller use.

    client = LakehouseClient("http://127.0.0.1:3001", token)
    result = client.read("export.stream", dataset_id, columns=["a"], limit=100, order="row_index")
    result.table, result.source, result.reason, result.snapshot_id
    with client.stream("export.stream", dataset_id) as rows:    # record batches as they arrive
        for batch in rows: ...
    client.ingest(dataset_id, "sync.full")   # retries 503 (G2 backpressure) after Retry-After, then raises
    client.route("export.stream", dataset_id); client.flags(dataset_id)

A refusal raises ``ServiceError`` with the status and the service's one-line reason.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.ipc as ipc

from lakehouse_dagster.core.errors import LakehouseError

ARROW_STREAM = "application/vnd.apache.arrow.stream"
NDJSON = "application/x-ndjson"


class ServiceError(LakehouseError):
    """A non-2xx answer: ``status``, the service's one-line ``message`` and, for a 503, ``retry_after`` seconds."""

    def __init__(self, status: int, message: str, retry_after: float | None = None):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after


@dataclasses.dataclass
class ReadResult:
    table: pa.Table | None  # Arrow reads
    rows: list[dict] | None  # NDJSON reads
    source: str  # iceberg | postgres
    reason: str  # iceberg@eventual, pg@fallback, ...
    mode: str
    snapshot_id: int | None


@dataclasses.dataclass
class ReadStream:
    """An open read: its routing headers, and its record batches as they arrive (iterate once)."""

    source: str
    reason: str
    mode: str
    snapshot_id: int | None
    batches: Iterator[pa.RecordBatch]
    schema: pa.Schema

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self.batches


class _ResponseFile:
    """A streaming httpx response as the file object pyarrow's stream reader reads from. Chunks are kept as they
    arrive and joined only for the bytes a read asks for (a record batch's body is read whole: one join)."""

    def __init__(self, response: httpx.Response):
        self._chunks = response.iter_raw()
        self._pending: collections.deque[memoryview] = collections.deque()
        self._size = 0
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        while n < 0 or self._size < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            if chunk:
                self._pending.append(memoryview(chunk))
                self._size += len(chunk)
        if n < 0 or n > self._size:
            n = self._size
        if self._pending and len(self._pending[0]) >= n:  # the common case for small reads: one slice
            head = self._pending[0]
            out = bytes(head[:n])
            if len(head) == n:
                self._pending.popleft()
            else:
                self._pending[0] = head[n:]
            self._size -= n
            return out
        parts, need = [], n
        while need:
            head = self._pending.popleft()
            if len(head) > need:
                self._pending.appendleft(head[need:])
                head = head[:need]
            parts.append(head)
            need -= len(head)
        self._size -= n
        return b"".join(parts)

    def readable(self) -> bool:
        return True


class LakehouseClient:
    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 300.0, retries: int = 5):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)
        self.retries = retries

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LakehouseClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- reads ---------------------------------------------------------------------------------------------

    @staticmethod
    def _read_body(reader, dataset_id, columns, limit, order) -> dict[str, Any]:
        body: dict[str, Any] = {"reader": reader, "dataset_id": str(dataset_id)}
        if columns is not None:
            body["columns"] = list(columns)
        if limit is not None:
            body["limit"] = limit
        if order is not None:
            body["order"] = order
        return body

    @contextlib.contextmanager
    def stream(
        self, reader: str, dataset_id: uuid.UUID | str, *, columns=None, limit=None, order=None
    ) -> Iterator[ReadStream]:
        """The read as Arrow record batches, one at a time (memory bounded by a batch)."""
        body = self._read_body(reader, dataset_id, columns, limit, order)
        for attempt in range(self.retries + 1):
            with self._http.stream("POST", "/lakehouse/read", json=body, headers={"Accept": ARROW_STREAM}) as resp:
                if resp.status_code == 503 and attempt < self.retries:
                    resp.read()
                    time.sleep(_retry_after(resp))
                    continue
                _raise_for(resp)
                reader_ = ipc.open_stream(pa.PythonFile(_ResponseFile(resp), mode="r"))
                yield ReadStream(*_route_headers(resp), batches=iter(reader_), schema=reader_.schema)
                return

    def read(self, reader: str, dataset_id: uuid.UUID | str, *, columns=None, limit=None, order=None) -> ReadResult:
        """The whole read as one Arrow table."""
        with self.stream(reader, dataset_id, columns=columns, limit=limit, order=order) as s:
            table = pa.Table.from_batches(list(s.batches), schema=s.schema)
            return ReadResult(table, None, s.source, s.reason, s.mode, s.snapshot_id)

    def read_ndjson(
        self, reader: str, dataset_id: uuid.UUID | str, *, columns=None, limit=None, order=None
    ) -> ReadResult:
        body = self._read_body(reader, dataset_id, columns, limit, order)
        resp = self._send("POST", "/lakehouse/read", json=body, headers={"Accept": NDJSON})
        rows = [json.loads(line) for line in resp.text.splitlines() if line]
        return ReadResult(None, rows, *_route_headers(resp))

    # --- the rest ------------------------------------------------------------------------------------------

    def ingest(self, dataset_id: uuid.UUID | str, writer: str) -> dict:
        """Run a source writer; a 503 (G2 backpressure) is retried after its Retry-After, ``retries`` times."""
        return self._send("POST", "/lakehouse/ingest", json={"dataset_id": str(dataset_id), "writer": writer}).json()

    def route(self, reader: str, dataset_id: uuid.UUID | str) -> dict:
        return self._send("GET", "/lakehouse/route", params={"reader": reader, "dataset_id": str(dataset_id)}).json()

    def flags(self, dataset_id: uuid.UUID | str) -> dict:
        return self._send("GET", "/lakehouse/flags", params={"dataset_id": str(dataset_id)}).json()

    def ready(self) -> dict:
        return self._send("GET", "/readyz", retry=False).json()

    def metrics(self) -> str:
        return self._send("GET", "/metrics").text

    def _send(self, method: str, path: str, *, retry: bool = True, **kw) -> httpx.Response:
        for attempt in range(self.retries + 1):
            resp = self._http.request(method, path, **kw)
            if resp.status_code == 503 and retry and attempt < self.retries:
                time.sleep(_retry_after(resp))
                continue
            _raise_for(resp)
            return resp
        raise AssertionError("unreachable")


def _retry_after(resp: httpx.Response) -> float:
    try:
        return max(0.0, min(60.0, float(resp.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    resp.read()
    try:
        message = resp.json().get("error") or resp.text
    except ValueError:
        message = resp.text.strip() or resp.reason_phrase
    retry = _retry_after(resp) if "retry-after" in resp.headers else None
    raise ServiceError(resp.status_code, message, retry)


def _route_headers(resp: httpx.Response) -> tuple[str, str, str, int | None]:
    snap = resp.headers.get("x-lakehouse-snapshot-id")
    return (
        resp.headers.get("x-lakehouse-source", ""),
        resp.headers.get("x-lakehouse-reason", ""),
        resp.headers.get("x-lakehouse-mode", ""),
        int(snap) if snap else None,
    )
