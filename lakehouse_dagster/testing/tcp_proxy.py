"""A small TCP fault proxy in front of Postgres, for the infrastructure-fault tests (issue 32): the project's
sessions go through it, and a test drops or freezes them as a network would — Toxiproxy's two toxics that
matter here, without Toxiproxy (not packaged where the tests run).

``reset()`` ends every connection at once with a TCP RST (SO_LINGER 0: a failover, a NAT table flushed, a
middlebox that gave up); new connections are served. ``stall()`` stops forwarding in both directions, on the
connections open and on the ones opened after (their handshake completes, their startup message goes
nowhere): a network gone silent. ``resume()`` forwards again what was held. What a userspace proxy cannot
do is stop ACKing: the kernel under it still acknowledges data and keepalive probes, so a stall here is
bounded only by the client's own timers (libpq's ``connect_timeout``) and not by TCP keepalives or
``tcp_user_timeout`` — those need a real partition (iptables/netem).

Upstream is a TCP ``(host, port)`` or a Unix socket path (the embedded server listens on one).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from urllib.parse import quote, urlencode

from psycopg.conninfo import conninfo_to_dict

_CHUNK = 64 * 1024
_TICK = 0.05  # how often a pump looks at the stall and close flags


def upstream_of(dsn: str) -> str | tuple[str, int]:
    """Where ``dsn`` connects: a Unix socket path (host is a directory) or ``(host, port)``."""
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "/tmp")
    port = int(params.get("port") or 5432)
    if host.startswith("/"):
        return f"{host.rstrip('/')}/.s.PGSQL.{port}"
    return (host, port)


class TcpProxy:
    """Listens on 127.0.0.1:<free port> and forwards each connection to ``upstream``; thread per direction."""

    def __init__(self, upstream: str | tuple[str, int]):
        self.upstream = upstream
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._running = threading.Event()  # set: forwarding; clear: stalled
        self._running.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self.accepted = 0
        self.resets = 0
        self._acceptor = threading.Thread(target=self._accept_loop, name="tcp-proxy-accept", daemon=True)
        self._acceptor.start()

    @classmethod
    def for_dsn(cls, dsn: str) -> TcpProxy:
        return cls(upstream_of(dsn))

    def dsn(self, dsn: str) -> str:
        """``dsn`` pointed at this proxy, as a URI (the ADBC driver and SQLAlchemy take URIs), every other
        parameter kept."""
        params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if k not in ("host", "port", "hostaddr")}
        user = quote(params.pop("user", "postgres"), safe="")
        password = params.pop("password", None)
        auth = user + (":" + quote(password, safe="") if password else "")
        dbname = quote(params.pop("dbname", "postgres"), safe="")
        query = ("?" + urlencode(params)) if params else ""
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}{query}"

    # --- faults ---------------------------------------------------------------------------------------

    def reset(self) -> int:
        """RST every open connection, both sides; returns how many were cut."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                _rst(s)
        self.resets += len(pairs)
        return len(pairs)

    def stall(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def close(self) -> None:
        self._closed.set()
        self._running.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.reset()
        self._acceptor.join(5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- forwarding -----------------------------------------------------------------------------------

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        up.connect(self.upstream)
        return up

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                ready, _, _ = select.select([self._listener], [], [], _TICK)
                if not ready:
                    continue
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = self._connect_upstream()
            except OSError:  # Postgres down: the client sees its connection closed, as with no proxy
                _rst(client)
                continue
            with self._lock:
                self._pairs.append((client, upstream))
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), name="tcp-proxy-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                if not self._running.wait(_TICK):
                    continue  # stalled: what arrives stays in the kernel's buffers until resume
                ready, _, _ = select.select([src], [], [], _TICK)
                if not ready or not self._running.is_set():
                    continue
                data = src.recv(_CHUNK)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ValueError):
            pass  # the other side was reset or closed (a closed socket's fileno is -1: ValueError in select)
        self._drop(src, dst)

    def _drop(self, a: socket.socket, b: socket.socket) -> None:
        with self._lock:
            self._pairs = [p for p in self._pairs if a not in p]
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


def _rst(s: socket.socket) -> None:
    """Close with a TCP RST (SO_LINGER on, zero seconds), not a FIN."""
    with contextlib.suppress(OSError):
        if s.family == socket.AF_INET:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.close()
