"""moto_server (a real S3 HTTP endpoint, moto[server]) on loopback, for the object-store fault tests and the crash
harness's object-store mode: no cloud, no network."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# What an S3 client of ours needs besides the endpoint: moto takes any credentials; no instance metadata lookups.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """``moto_server`` in its own process; ``endpoint`` its URL, ``client`` a boto3 client of it."""

    def __init__(self) -> None:
        import boto3  # lazy: only the object-store tests and benches need it

        port = _free_port()
        exe = Path(sys.executable).with_name("moto_server")
        self.proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **AWS_ENV},
        )
        self.endpoint = f"http://127.0.0.1:{port}"
        self.client: Any = boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.list_buckets()
                return
            except Exception:  # noqa: BLE001 - not listening yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def __enter__(self) -> MotoServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
