"""The service's outermost layer: what a web page in the operator's browser could otherwise do (cross-origin
requests, DNS rebinding, a ``text/plain`` simple POST), bearer-token auth and the per-endpoint request metrics —
before any route runs (service/app.py wraps its Starlette app in ``Guard``)."""

from __future__ import annotations

import hmac
import json
import time

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from lakehouse_dagster.core.network import is_loopback
from lakehouse_dagster.service.errors import log_answer
from lakehouse_dagster.service.state import Service

PUBLIC_PATHS = ("/healthz",)
ENDPOINTS = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/lakehouse/read",
    "/lakehouse/ingest",
    "/lakehouse/route",
    "/lakehouse/flags",
    "/lakehouse/fallback",
)
BODY_TYPES = ("application/json",)  # what POST bodies must say they are (a browser's simple POST cannot)


class Guard:
    """Outermost: what a web page in the operator's browser could otherwise do (cross-origin requests, DNS
    rebinding, a ``text/plain`` simple POST), bearer-token auth (constant-time compare; /healthz is open) and
    per-endpoint request metrics."""

    def __init__(self, app: ASGIApp, svc: Service, host: str = "127.0.0.1"):
        self.app = app
        self.svc = svc
        token = svc.settings.service.token
        self._token = token.encode() if token else None
        # Without a token the Host is the defence against DNS rebinding (a page of evil.example whose name now
        # resolves to 127.0.0.1 is same-origin to itself): only loopback names are answered.
        self._hosts = None if token else {"localhost", "127.0.0.1", "::1", host.strip("[]").lower()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else "other"
        started = time.perf_counter()
        status = {"code": 500}

        async def counted_send(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is None and path not in PUBLIC_PATHS and not self._authorised(scope):
                refusal = JSONResponse(
                    {"error": "unauthorized"}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
            if refusal is None and scope["method"] == "POST" and path in ENDPOINTS:
                refusal = _body_type_refusal(scope)
            if refusal is not None:
                said = json.loads(bytes(refusal.body))["error"]
                if refusal.status_code == 401:
                    said += f" ({self._why_unauthorised(scope)})"  # the log only: the caller learns no more
                log_answer(f"{scope['method']} {path[:200]}: ", refusal.status_code, said)
                await refusal(scope, receive, counted_send)
                return
            await self.app(scope, receive, counted_send)
        finally:
            m = self.svc.metrics
            m.http_requests.labels(endpoint, str(status["code"])).inc()
            m.http_seconds.labels(endpoint).observe(time.perf_counter() - started)

    def _refusal(self, scope: Scope) -> Response | None:
        """403 for a request a browser made on a page's behalf (the service has no pages: no Origin is its own)
        and, without a token, for a Host that is not a loopback name."""
        headers = {name: value for name, value in scope["headers"]}
        host = headers.get(b"host", b"").decode("latin-1")
        if self._hosts is not None:
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            name = name.strip("[]").lower()
            if name not in self._hosts and not is_loopback(name):
                return _forbidden(
                    f"Host {host[:100]!r} is not this service's address; without LAKEHOUSE_API_TOKEN only requests "
                    "to 127.0.0.1, localhost or ::1 are answered (a page of another site is refused)"
                )
        origin = headers.get(b"origin")
        if origin is not None and origin.decode("latin-1") not in (f"http://{host}", f"https://{host}"):
            return _forbidden(
                f"cross-origin request refused (Origin {origin.decode('latin-1')[:100]!r}): the service answers "
                "programs, not web pages; call it from the app's server side"
            )
        site = headers.get(b"sec-fetch-site")
        if site is not None and site not in (b"same-origin", b"none"):
            return _forbidden(
                f"cross-site request refused (Sec-Fetch-Site {site.decode('latin-1')[:30]}): the service answers "
                "programs, not web pages"
            )
        return None

    @staticmethod
    def _why_unauthorised(scope: Scope) -> str:
        """What was wrong with the credentials, for the log; never the token given."""
        value = next((v for name, v in scope["headers"] if name == b"authorization"), None)
        if value is None:
            return "no Authorization header: send Authorization: Bearer <LAKEHOUSE_API_TOKEN>"
        if value.partition(b" ")[0].lower() != b"bearer":
            return "the Authorization header is not a bearer token: send Authorization: Bearer <LAKEHOUSE_API_TOKEN>"
        return "the bearer token is not this service's LAKEHOUSE_API_TOKEN"

    def _authorised(self, scope: Scope) -> bool:
        if self._token is None:
            return True  # no token configured: loopback only (service/server.py refuses anything else)
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self._token)
        return False


def _forbidden(message: str) -> Response:
    return JSONResponse({"error": message}, status_code=403)


def _body_type_refusal(scope: Scope) -> Response | None:
    """415 unless the body says it is JSON: a browser sends ``text/plain`` (or no type) cross-origin without a
    preflight; ``application/json`` it never sends without asking first."""
    given = b""
    for name, value in scope["headers"]:
        if name == b"content-type":
            given = value
            break
    media = given.split(b";", 1)[0].strip().lower().decode("latin-1")
    if media in BODY_TYPES:
        return None
    said = f"Content-Type {media[:60]!r}" if media else "no Content-Type"
    return JSONResponse(
        {"error": f"{scope['method']} {scope['path']} takes a JSON body: send Content-Type: application/json ({said})"},
        status_code=415,
    )
