"""The webhook HTTP: one post to a Slack-compatible receiver. The URL is a secret: never logged or repeated."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request

from lakehouse_dagster.status.alerts.kinds import ENV, IDEMPOTENCY_FIELD, _line


class PostFailed(Exception):
    """A post that did not get a 2xx answer in time: the receiver's host and why (never the URL)."""


def webhook_problem(url: str | None) -> str | None:
    """Why the URL cannot be posted to (None: it can). Never repeats the URL: it is a secret."""
    if not url:
        return f'{ENV} is not set: no alert is posted (set it to a Slack incoming-webhook URL, or any receiver of a JSON body {{"text": ...}})'
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{ENV} is set but is not an http(s) URL with a host (its value is not shown: it is a secret); no alert is posted"
    return None


def post_message(url: str, payload: dict, timeout: float) -> None:
    """POST ``payload`` as JSON; raises PostFailed unless a 2xx answer came within ``timeout`` seconds (the whole
    exchange, not each socket read: the request runs in a thread that is abandoned when late)."""
    host = urllib.parse.urlsplit(url).hostname or "?"
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", **_idempotency_header(payload)},
        method="POST",
    )
    outcome: dict = {}

    def send() -> None:
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # (http(s) only: webhook_problem)
                response.read(65536)
                outcome["status"] = response.status
        except urllib.error.HTTPError as exc:
            outcome["error"] = f"HTTP {exc.code}"
            exc.close()
        except urllib.error.URLError as exc:
            outcome["error"] = _reason(exc.reason, timeout)
        except OSError as exc:  # includes socket.timeout / TimeoutError while reading the answer
            outcome["error"] = _reason(exc, timeout)

    thread = threading.Thread(target=send, name="lakehouse-alert-post", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    if thread.is_alive():
        raise PostFailed(f"{host}: no answer within {timeout:g} s")
    if "error" in outcome:
        raise PostFailed(f"{host}: {_scrub(outcome['error'], url)}")
    if not 200 <= outcome.get("status", 0) < 300:
        raise PostFailed(f"{host}: HTTP {outcome.get('status')}")


def _idempotency_header(payload: dict) -> dict[str, str]:
    key = payload.get(IDEMPOTENCY_FIELD)
    return {"Idempotency-Key": str(key)} if key else {}


def _reason(exc: object, timeout: float) -> str:
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return _line(exc, 200)


def _scrub(text: str, url: str) -> str:
    """Belt and braces: no part of the URL past its host survives in a text we keep."""
    parts = urllib.parse.urlsplit(url)
    for secret in (url, parts.path, parts.query):
        if secret and len(secret) > 1:
            text = text.replace(secret, "<webhook>")
    return text
