"""ASGI middleware: metrics, the database away, text guards, per-principal
rate limits, authentication (the Idempotency-Key's is service/api/idempotent.py).

Pure ASGI (no BaseHTTPMiddleware) so that streaming responses (server-sent
events) pass through untouched and a stored response can be replayed byte
for byte.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.requests import Request

from service.api.group_commit import DATABASE_DOWN
from service.api.outage import RETRY_AFTER_SECONDS, Outage
from service.api.problems import PROBLEM_JSON, TYPE_BASE
from service.api.ratelimit import Buckets, KnownCredentials, retry_after
from service.app.errors import AppError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc"})


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def send_problem(
    send: Send,
    status: int,
    kind: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
) -> None:
    body = json.dumps(
        {"type": TYPE_BASE + kind, "title": title, "status": status, "detail": detail}
    ).encode()
    raw = [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


# -- text the database cannot store ---------------------------------------------------


def _bad_query(raw: bytes) -> str | None:
    """Why a query string cannot reach SQL as text, or None: Postgres text
    holds neither NUL nor invalid UTF-8 (lone surrogates included)."""
    for pair in raw.split(b"&"):
        name, _, value = pair.partition(b"=")
        for part in (name, value):
            data = unquote_to_bytes(part.replace(b"+", b" "))
            if b"\x00" in data:
                return f"{name.decode('latin-1')!r} contains a NUL character"
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                return f"{name.decode('latin-1')!r} is not valid UTF-8"
    return None


class TextGuardMiddleware:
    """Refuses a query string that no handler could store or compare, with
    a problem naming the parameter, before it reaches a handler."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("query_string"):
            why = _bad_query(scope["query_string"])
            if why is not None:
                await send_problem(send, 422, "invalid-request", "Invalid request", why)
                return
        await self.app(scope, receive, send)


# -- the database away ---------------------------------------------------------------


class DatabaseDownMiddleware:
    """Answers a request that the database's absence failed outside a route
    (claiming its Idempotency-Key, authenticating its token) with 503 and
    Retry-After, and notes the outage (logged once): not Starlette's 500,
    re-raised for uvicorn to log a traceback per request. A response already
    started (an event stream) is ended cleanly instead."""

    def __init__(self, app: ASGIApp, outage: Outage) -> None:
        self.app = app
        self.outage = outage

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except DATABASE_DOWN as error:
            self.outage.failed(error)
            if started:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await send_problem(
                send,
                503,
                "database-unavailable",
                "Database unavailable",
                "the database cannot be reached; retry shortly",
                {"Retry-After": str(RETRY_AFTER_SECONDS)},
            )


# -- metrics -----------------------------------------------------------------------------


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "qm_http_requests",
            "HTTP requests",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "qm_http_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def wrapped(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, wrapped)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(scope["method"], template, str(status)).inc()
            self.metrics.latency.labels(scope["method"], template).observe(
                time.perf_counter() - start
            )


# -- rate limits and load shedding -----------------------------------------------------


def _credential(scope: Scope) -> str | None:
    """The bearer token, whatever the scheme's case and the spaces around."""
    scheme, _, credential = (header(scope, b"authorization") or "").strip().partition(" ")
    credential = credential.strip()
    return credential if scheme.lower() == "bearer" and credential else None


#: Paths of event streams (the API's and the console's), which stay open and
#: are not counted in flight.
_STREAMS = frozenset({"/v1/events", "/ui/events"})


@dataclass
class Shedding:
    """When to answer 503 before doing any work: more requests in flight in
    this process than ``max_in_flight`` (they queue for its threads and its
    pool's connections), or more submissions waiting for the group commit
    than ``max_backlog`` (``backlog()``)."""

    max_in_flight: int
    max_backlog: int
    backlog: Callable[[], int]
    in_flight: int = 0


class RateLimitMiddleware:
    """Limits every request to a token bucket of its principal's, or of its
    client address while its principal is not known without I/O (a token
    not seen yet, a made-up one, none); sheds load past ``shedding``'s
    bounds. Both answer before any body is read or database asked."""

    def __init__(
        self, app: ASGIApp, buckets: Buckets, anonymous: Buckets, shedding: Shedding
    ) -> None:
        self.app = app
        self.buckets = buckets
        self.anonymous = anonymous
        self.shedding = shedding
        self.known = KnownCredentials()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        shed = self.shedding
        if shed.in_flight >= shed.max_in_flight or shed.backlog() >= shed.max_backlog:
            await send_problem(
                send,
                503,
                "overloaded",
                "Overloaded",
                "the API has more work queued than it can do soon; retry shortly",
                {"Retry-After": "1"},
            )
            return
        buckets, key, who = self._bucket(scope)
        allowed, left, wait = await buckets.take(key)
        reset = max(1, math.ceil((buckets.burst - left) / buckets.rate))
        window = max(1, round(buckets.burst / buckets.rate))
        headers = {
            "RateLimit-Limit": str(buckets.burst),
            "RateLimit-Remaining": str(int(left)),
            "RateLimit-Reset": str(reset),
            "RateLimit-Policy": f"{buckets.burst};w={window}",
        }
        if not allowed:
            retry = retry_after(wait)
            await send_problem(
                send,
                429,
                "rate-limited",
                "Too many requests",
                f"{who} is limited to {buckets.rate:g} requests/s "
                f"(burst {buckets.burst}); retry after {retry} s",
                {**headers, "Retry-After": str(retry)},
            )
            return
        raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *raw]}
            await send(message)

        if scope["path"] in _STREAMS:  # open for as long as its client watches
            await self.app(scope, receive, wrapped)
            return
        shed.in_flight += 1
        try:
            await self.app(scope, receive, wrapped)
        finally:
            shed.in_flight -= 1

    def _bucket(self, scope: Scope) -> tuple[Buckets, str, str]:
        credential = _credential(scope)
        if credential is not None:
            authenticator = scope["app"].state.container.authenticator
            principal = authenticator.cached(credential)
            if principal is not None:
                self.known.learn(credential, principal.key)
                return self.buckets, "principal:" + principal.key, "this principal"
            known = self.known.principal_key(credential)
            if known is not None:  # its authentication is being looked up again
                return self.buckets, "principal:" + known, "this principal"
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        return self.anonymous, "address:" + address, "an unauthenticated client address"


# -- authentication --------------------------------------------------------------------

#: Authenticated here: whatever may carry a body, and DELETE (whose
#: Idempotency-Key is scoped by its principal too).
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def has_body(scope: Scope) -> bool:
    length = header(scope, b"content-length")
    return bool(length and length.strip() != "0") or header(scope, b"transfer-encoding") is not None


class AuthenticateMiddleware:
    """Authenticates every write, and every request with a body, before a
    byte of it is read (a made-up token with a 100 MB body is answered 401
    from its headers), leaving the principal where the routes' dependency
    and the Idempotency-Key middleware find it. Routes then authorise before
    they read (``read_body``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] not in PUBLIC_PATHS
            and (scope["method"] in _WRITE_METHODS or has_body(scope))
        ):
            from service.api.deps import current_principal

            try:
                await current_principal(Request(scope))
            except AppError as error:
                headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
                await send_problem(
                    send, error.status, error.kind, error.title, error.detail, headers
                )
                return
        await self.app(scope, receive, send)
