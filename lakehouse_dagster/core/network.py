"""Which addresses a listener may use without authentication: the Dagster UI never leaves loopback, the service
only with a token (cli/up/, service/server.py)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
