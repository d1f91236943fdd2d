"""A small Python client of the service: what the tests, the bench and a Python caller use.

    client = LakehouseClient("http://127.0.0.1:3001", token)
    result = client.read("export.stream", dataset_id, columns=["a"], limit=100, order="row_index")
    result.table, result.source, result.reason, result.snapshot_id
    with client.stream("export.stream", dataset_id) as rows:    # record batches as they arrive
        for batch in rows: ...
    client.ingest(dataset_id, "sync.full")   # retries 503 (G2 backpressure) after Retry-After, then raises
    client.route("export.stream", dataset_id); client.flags(dataset_id)
    client.fallback("export.stream", dataset_id, "ml-runner timeout")   # an app's own router fell back to PG

A refusal raises ``ServiceError`` with the status and the service's one-line reason.

Reads stream through the standard library's ``http.client``, whose response pyarrow's stream reader reads
directly: a record batch's body is copied once out of the socket. Through httpx (h11) the same export cost the
client 3-4x the CPU (docs/benchmarks.md); every other call uses httpx.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import time
import urllib.parse
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


class LakehouseClient:
    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 300.0, retries: int = 5):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)
        self._url = urllib.parse.urlsplit(base_url.rstrip("/"))
        if self._url.scheme not in ("http", "https") or not self._url.hostname:
            raise ValueError(f"base_url {base_url!r} is not an http:// or https:// address")
        self._auth = headers
        self._timeout = timeout
        self.retries = retries

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LakehouseClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- reads ---------------------------------------------------------------------------------------------

    @staticmethod
    def _read_body(reader, dataset_id, columns, limit, order, query=None) -> dict[str, Any]:
        body: dict[str, Any] = {"reader": reader, "dataset_id": str(dataset_id), **(query or {})}
        if columns is not None:
            body["columns"] = list(columns)
        if limit is not None:
            body["limit"] = limit
        if order is not None:
            body["order"] = order
        return body

    @contextlib.contextmanager
    def stream(
        self, reader: str, dataset_id: uuid.UUID | str, *, columns=None, limit=None, order=None, query=None
    ) -> Iterator[ReadStream]:
        """The read as Arrow record batches, one at a time (memory bounded by a batch). ``query``: a structured
        read's fields (where, aggregate, row_ids, after_row_index, row_index: docs/reads.md), sent as they are."""
        payload = json.dumps(self._read_body(reader, dataset_id, columns, limit, order, query)).encode()
        headers = {**self._auth, "Content-Type": "application/json", "Accept": ARROW_STREAM}
        for attempt in range(self.retries + 1):
            conn = self._connection()
            try:  # closing the connection is what tells the service a reader left early
                conn.request("POST", self._url.path + "/lakehouse/read", body=payload, headers=headers)
                resp = conn.getresponse()
                if resp.status == 503 and attempt < self.retries:
                    resp.read()
                    time.sleep(_retry_after(resp.headers))
                    continue
                if resp.status >= 400:
                    raise _error(resp.status, resp.headers, resp.read(), resp.reason)
                reader_ = ipc.open_stream(resp)  # a cut stream raises http.client.IncompleteRead
                yield ReadStream(*_route_headers(resp.headers), batches=iter(reader_), schema=reader_.schema)
                return
            finally:
                conn.close()

    def _connection(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._url.scheme == "https" else http.client.HTTPConnection
        host = self._url.hostname
        assert host  # __init__ refuses a base_url without one
        return kind(host, self._url.port, timeout=self._timeout)

    def read(
        self, reader: str, dataset_id: uuid.UUID | str, *, columns=None, limit=None, order=None, query=None
    ) -> ReadResult:
        """The whole read as one Arrow table."""
        with self.stream(reader, dataset_id, columns=columns, limit=limit, order=order, query=query) as s:
            table = pa.Table.from_batches(list(s.batches), schema=s.schema)
            return ReadResult(table, None, s.source, s.reason, s.mode, s.snapshot_id)

    def read_ndjson(
        self, reader: str, dataset_id: uuid.UUID | str, *, columns=None, limit=None, order=None, query=None
    ) -> ReadResult:
        body = self._read_body(reader, dataset_id, columns, limit, order, query)
        resp = self._send("POST", "/lakehouse/read", json=body, headers={"Accept": NDJSON})
        rows = [json.loads(line) for line in resp.text.splitlines() if line]
        return ReadResult(None, rows, *_route_headers(resp.headers))

    # --- the rest ------------------------------------------------------------------------------------------

    def ingest(self, dataset_id: uuid.UUID | str, writer: str) -> dict:
        """Run a source writer; a 503 (G2 backpressure) is retried after its Retry-After, ``retries`` times."""
        return self._send("POST", "/lakehouse/ingest", json={"dataset_id": str(dataset_id), "writer": writer}).json()

    def route(self, reader: str, dataset_id: uuid.UUID | str) -> dict:
        return self._send("GET", "/lakehouse/route", params={"reader": reader, "dataset_id": str(dataset_id)}).json()

    def flags(self, dataset_id: uuid.UUID | str) -> dict:
        return self._send("GET", "/lakehouse/flags", params={"dataset_id": str(dataset_id)}).json()

    def fallback(self, reader: str, dataset_id: uuid.UUID | str, reason: str) -> dict:
        """Report a fallback to Postgres that the caller's own router took (recorded as the service's own are)."""
        body = {"reader": reader, "dataset_id": str(dataset_id), "reason": reason}
        return self._send("POST", "/lakehouse/fallback", json=body).json()

    def ready(self) -> dict:
        return self._send("GET", "/readyz", retry=False).json()

    def metrics(self) -> str:
        return self._send("GET", "/metrics").text

    def _send(self, method: str, path: str, *, retry: bool = True, **kw) -> httpx.Response:
        for attempt in range(self.retries + 1):
            resp = self._http.request(method, path, **kw)
            if resp.status_code == 503 and retry and attempt < self.retries:
                time.sleep(_retry_after(resp.headers))
                continue
            _raise_for(resp)
            return resp
        raise AssertionError("unreachable")


def _retry_after(headers) -> float:
    try:
        return max(0.0, min(60.0, float(headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    resp.read()
    raise _error(resp.status_code, resp.headers, resp.content, resp.reason_phrase)


def _error(status: int, headers, body: bytes, reason: str) -> ServiceError:
    text = body.decode("utf-8", "replace")
    try:
        message = json.loads(text).get("error") or text
    except (ValueError, AttributeError):
        message = text.strip() or reason
    retry = _retry_after(headers) if "retry-after" in headers else None
    return ServiceError(status, message, retry)


def _route_headers(headers) -> tuple[str, str, str, int | None]:
    snap = headers.get("x-lakehouse-snapshot-id")
    return (
        headers.get("x-lakehouse-source", ""),
        headers.get("x-lakehouse-reason", ""),
        headers.get("x-lakehouse-mode", ""),
        int(snap) if snap else None,
    )
