"""A small HTTP reverse proxy in front of an S3-compatible store (moto_server), for the object-store fault tests
(issue 32): the warehouse's FileIO talks to the proxy, and a test makes the store answer as a real one does on a
bad day — S3's own 503 SlowDown / 500 InternalError, to every request, to the next few or to a seeded share of
them, or slowly — and then pass through again, without restarting anything.

Why HTTP and not tcp_proxy.py: a 5xx is an answer, not a broken connection. The AWS SDK under pyarrow retries an
S3 error response it classifies as retryable (throttling, 500, 503) on the same connection; only an HTTP-level
proxy can produce one. Why not Toxiproxy or a MinIO fault mode: neither is packaged where the tests run.

Requests are forwarded whole (the body read, then sent upstream with its length): the SDK signs its requests, and
moto does not check the signature against the Host header, so the Host of the proxy is kept as sent. A failed
request never reaches upstream (as with S3: a 503 SlowDown stored nothing). A delay holds the upstream's answer
back after upstream acted on the request, the worst case for a client timer: the write happened, the client gave
up on it (its retry writes the same object again; S3 PUTs are idempotent by key).
"""

from __future__ import annotations

import http.client
import random
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

_ERRORS = {
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
}
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}
_TICK = 0.05  # a held response looks at the delay this often, so pass_through() releases it promptly


class S3FaultProxy:
    """Listens on 127.0.0.1:<free port> (``endpoint``) and forwards to ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str):
        parsed = urlparse(upstream)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._lock = threading.Lock()
        self._status = 503
        self._every = False
        self._next = 0
        self._share = 0.0
        self._rng = random.Random(0)
        self._delay = 0.0
        self.requests = 0  # every request seen
        self.failed = 0  # answered with an injected error
        self.forwarded = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(_TICK,), daemon=True)
        self._thread.start()

    # --- faults: each replaces the one before -----------------------------------------------------------

    def fail(self, status: int = 503, *, count: int | None = None, share: float | None = None, seed: int = 0) -> None:
        """Answer ``status`` (503 SlowDown or 500 InternalError) to every request; with ``count``, to the next that
        many only; with ``share``, to that fraction of requests, drawn from ``seed`` (the same draws each run; which
        request gets one still depends on the client's threads)."""
        if status not in _ERRORS:
            raise ValueError(f"status {status}: only {sorted(_ERRORS)}")
        with self._lock:
            self._status, self._delay = status, 0.0
            self._every = count is None and share is None
            self._next = count or 0
            self._share = share or 0.0
            self._rng = random.Random(seed)

    def slow(self, seconds: float) -> None:
        """Hold every answer back ``seconds`` (after upstream acted on the request); no errors."""
        with self._lock:
            self._every, self._next, self._share, self._delay = False, 0, 0.0, seconds

    def pass_through(self) -> None:
        with self._lock:
            self._every, self._next, self._share, self._delay = False, 0, 0.0, 0.0

    def close(self) -> None:
        self.pass_through()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> S3FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- per request ------------------------------------------------------------------------------------

    def _verdict(self) -> int | None:
        """The injected status for this request, or None to forward it."""
        with self._lock:
            self.requests += 1
            hit = self._every
            if not hit and self._next > 0:
                self._next -= 1
                hit = True
            if not hit and self._share > 0:
                hit = self._rng.random() < self._share
            if hit:
                self.failed += 1
                return self._status
            self.forwarded += 1
            return None

    def _hold(self, started: float) -> None:
        while True:
            with self._lock:
                left = started + self._delay - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, _TICK))


def _handler(proxy: S3FaultProxy) -> type[BaseHTTPRequestHandler]:  # noqa: C901
    """Complex on purpose: the handler class's methods are counted with the factory that closes over the proxy."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the SDK expects of S3
        upstream: http.client.HTTPConnection | None = None

        def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
            pass  # quiet: pytest shows stderr of a failing test, and a request log there is noise

        def _body(self) -> bytes:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            if self.command != "HEAD" or not any(k.lower() == "content-length" for k, _ in headers):
                self.send_header("Content-Length", str(len(body)))  # a HEAD's is the object's, kept as sent
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def handle_one_request(self) -> None:
            try:
                super().handle_one_request()
            except (BrokenPipeError, ConnectionResetError):  # the client gave up on a held answer (its timeout)
                self.close_connection = True

        def _handle(self) -> None:
            started = time.monotonic()
            body = self._body()  # read whole before answering: the connection stays usable for the next request
            status = proxy._verdict()
            if status is not None:
                code, message = _ERRORS[status]
                rid = uuid.uuid4().hex[:16].upper()
                xml = (
                    '<?xml version="1.0" encoding="UTF-8"?>\n'
                    f"<Error><Code>{code}</Code><Message>{message}</Message><RequestId>{rid}</RequestId></Error>"
                ).encode()
                self._answer(status, [("Content-Type", "application/xml"), ("x-amz-request-id", rid)], xml)
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            headers["Content-Length"] = str(len(body))
            for attempt in range(2):  # an idle upstream connection moto closed: reconnect once
                if self.upstream is None:
                    self.upstream = http.client.HTTPConnection(*proxy._upstream, timeout=60)
                try:
                    self.upstream.request(self.command, self.path, body=body, headers=headers)
                    resp = self.upstream.getresponse()
                    data = resp.read()
                    break
                except (http.client.HTTPException, OSError):
                    self.upstream.close()
                    self.upstream = None
                    if attempt:
                        raise
            proxy._hold(started)
            drop = _HOP if self.command == "HEAD" else _HOP | {"content-length"}
            self._answer(resp.status, [(k, v) for k, v in resp.getheaders() if k.lower() not in drop], data)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

    return Handler
