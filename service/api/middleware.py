"""ASGI middleware: metrics, per-principal rate limits, Idempotency-Key.

Pure ASGI (no BaseHTTPMiddleware) so that streaming responses (server-sent
events) pass through untouched and a stored response can be replayed byte
for byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.requests import Request

from service.api.group_commit import DATABASE_DOWN, GroupCommit
from service.api.indoubt import PENDING, OutcomeUnknown
from service.api.outage import RETRY_AFTER_SECONDS, Outage
from service.api.problems import PROBLEM_JSON, TYPE_BASE
from service.api.ratelimit import Buckets, retry_after
from service.app.errors import AppError
from service.app.idempotency import (
    IN_FLIGHT_LEASE,
    Claimed,
    IdempotencyStore,
    InFlight,
    Mismatch,
    Outcome,
    Replay,
    Response,
    request_digest,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc"})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def principal_key(scope: Scope) -> str:
    """The credential a request presents, hashed: what keys and limits are
    scoped by (one token = one principal)."""
    auth = _header(scope, b"authorization") or ""
    return hashlib.sha256(auth.encode()).hexdigest()[:32]


async def _send_problem(
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
                await _send_problem(send, 422, "invalid-request", "Invalid request", why)
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
            await _send_problem(
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
    scheme, _, credential = (_header(scope, b"authorization") or "").strip().partition(" ")
    credential = credential.strip()
    return credential if scheme.lower() == "bearer" and credential else None


#: Paths of event streams, which stay open and are not counted in flight.
_STREAMS = frozenset({"/v1/events"})


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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        shed = self.shedding
        if shed.in_flight >= shed.max_in_flight or shed.backlog() >= shed.max_backlog:
            await _send_problem(
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
            await _send_problem(
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
                return self.buckets, "principal:" + principal.key, "this principal"
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        return self.anonymous, "address:" + address, "an unauthenticated client address"


# -- authentication --------------------------------------------------------------------

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    return (
        bool(length and length.strip() != "0") or _header(scope, b"transfer-encoding") is not None
    )


class AuthenticateMiddleware:
    """Authenticates every request that may carry a body before a byte of
    it is read (a made-up token with a 100 MB body is answered 401 from its
    headers), leaving the principal where the routes' dependency finds it.
    Routes then authorise before they read (``read_body``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] not in PUBLIC_PATHS
            and (scope["method"] in _BODY_METHODS or _has_body(scope))
        ):
            from service.api.deps import current_principal

            try:
                await current_principal(Request(scope))
            except AppError as error:
                headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
                await _send_problem(
                    send, error.status, error.kind, error.title, error.detail, headers
                )
                return
        await self.app(scope, receive, send)


# -- idempotency -------------------------------------------------------------------------

_KEEP_HEADERS = {b"content-type", b"etag", b"location"}


class IdempotencyMiddleware:
    #: How often a claim that could not be released is tried again.
    RELEASE_RETRY_SECONDS = 0.5

    def __init__(self, app: ASGIApp, store: IdempotencyStore) -> None:
        self.app = app
        self.store = store
        # Claims, and stored responses, that arrive together share a
        # transaction and a thread hop: one each per request cost several
        # times a submission's CPU (threads taking turns at the GIL around
        # every round trip).
        self._claims = GroupCommit(store.claim_many, shared=DATABASE_DOWN)
        self._finishes = GroupCommit(store.finish_many, shared=DATABASE_DOWN)
        self._releasing: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = _header(scope, b"idempotency-key") if scope["type"] == "http" else None
        if key is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        if not 1 <= len(key) <= 255:
            await _send_problem(
                send,
                400,
                "bad-idempotency-key",
                "Bad Idempotency-Key",
                "an Idempotency-Key is 1 to 255 characters",
            )
            return
        principal = principal_key(scope)
        claim = _Claim(self._claims, principal, key, scope)
        if not _has_body(scope):
            # Nothing to read first: claimed now, as any route answers.
            await claim.make()
            if claim.refused is not None:
                await _answer(claim.refused, send)
                return
        await self._run(scope, receive, send, claim)

    async def _run(self, scope: Scope, receive: Receive, send: Send, claim: _Claim) -> None:
        """Run the request; once claimed (when the route has read the whole
        body, after authorising: nothing is buffered here), store its
        response, then send it: a client that retries as soon as it has the
        answer finds it stored, not in flight. A request whose body the
        route never read (refused before) is answered and not stored."""
        held: list[Message] = []

        async def receive_and_claim() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not claim.claimed:
                claim.digest.update(message.get("body", b""))
                if not message.get("more_body", False):
                    await claim.make()
                    if claim.refused is not None:
                        raise _Answered
            return message

        async def hold(message: Message) -> None:
            if claim.claimed:
                held.append(message)
            else:
                await send(message)

        pending: list[OutcomeUnknown] = []
        scope[PENDING] = pending
        try:
            await self.app(scope, receive_and_claim, hold)
        except _Answered:
            assert claim.refused is not None
            await _answer(claim.refused, send)
            return
        except BaseException:
            if claim.claimed:
                await self._release(claim.principal, claim.key)
            raise
        if not claim.claimed:
            return
        principal, key = claim.principal, claim.key
        start = next((m for m in held if m["type"] == "http.response.start"), None)
        status = int(start["status"]) if start else 500
        if pending:
            # Committed or not, Postgres will say once it answers; the claim
            # stays in flight until then, and the retry gets what it says.
            self._later(self._settle(principal, key, pending[0]))
        elif status in (401, 429) or status >= 500:
            # Nothing to keep: the retry must run again. Held while the
            # database is down, the claim is released as soon as it is back.
            await self._release(principal, key)
        else:
            headers = [
                (k.decode("latin-1"), v.decode("latin-1"))
                for k, v in (start or {}).get("headers", [])
                if k.lower() in _KEEP_HEADERS
            ]
            body = b"".join(
                bytes(m.get("body", b"")) for m in held if m["type"] == "http.response.body"
            )
            response = Response(principal, key, status, headers, body)
            try:
                await self._finishes.submit(response)
            except DATABASE_DOWN:
                # What the request did has committed: its answer goes out,
                # and is stored for the retry once the database is back.
                self._later(self._retrying(lambda: self.store.finish_many([response])))
        for message in held:
            await send(message)

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, principal: str, key: str, unknown: OutcomeUnknown) -> None:
        """Store the original answer of a request whose commit's outcome was
        unknown, once it is known; or release its key if nothing committed."""
        created = await unknown.later()
        if created is None:
            await self._retrying(lambda: self.store.release(principal, key))
            return
        rendered = unknown.render(created)
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in rendered.raw_headers
            if k.lower() in _KEEP_HEADERS
        ]
        response = Response(principal, key, rendered.status_code, headers, bytes(rendered.body))
        await self._retrying(lambda: self.store.finish_many([response]))

    async def _retrying(self, action: Callable[[], object]) -> None:
        """``action`` in a thread, again every RELEASE_RETRY_SECONDS while the
        database refuses, for at most the in-flight lease."""
        deadline = time.monotonic() + IN_FLIGHT_LEASE.total_seconds()
        while True:
            try:
                await anyio.to_thread.run_sync(action)
                return
            except DATABASE_DOWN:
                if time.monotonic() > deadline:
                    return  # the lease ends the claim at worst
                await asyncio.sleep(self.RELEASE_RETRY_SECONDS)

    async def _release(self, principal: str, key: str) -> None:
        """Release a claim now or, if the database refuses (it is what failed
        the request, most often), from a background task as soon as it
        answers: otherwise the client's retry would meet 409 "in flight" for
        the whole lease, though this process knows the request has ended."""
        try:
            await anyio.to_thread.run_sync(self.store.release, principal, key)
        except Exception:
            # The request's own answer (its 503, or its error) goes out as it is.
            if (principal, key) not in self._releasing:
                self._releasing.add((principal, key))
                task = asyncio.get_running_loop().create_task(self._release_later(principal, key))
                self._tasks.add(task)  # the loop keeps only a weak reference
                task.add_done_callback(self._tasks.discard)

    async def _release_later(self, principal: str, key: str) -> None:
        deadline = time.monotonic() + IN_FLIGHT_LEASE.total_seconds()
        try:
            while time.monotonic() < deadline:
                await asyncio.sleep(self.RELEASE_RETRY_SECONDS)
                try:
                    await anyio.to_thread.run_sync(self.store.release, principal, key)
                    return
                except Exception:  # still down: the lease ends the claim at worst
                    continue
        finally:
            self._releasing.discard((principal, key))


class _Answered(Exception):
    """Raised from a route's ``receive`` when the claim is refused (a replay,
    a key in flight or reused): the middleware answers instead of the route."""


class _Claim:
    """One request's claim of its Idempotency-Key, made once its body is read."""

    def __init__(
        self, claims: GroupCommit[Any, Outcome], principal: str, key: str, scope: Scope
    ) -> None:
        self._claims = claims
        self.principal, self.key = principal, key
        self.digest = request_digest(
            scope["method"], scope["path"], scope.get("query_string", b"").decode("latin-1")
        )
        self.claimed = False
        self.refused: Outcome | None = None

    async def make(self) -> None:
        outcome = await self._claims.submit((self.principal, self.key, self.digest.digest()))
        if isinstance(outcome, Claimed):
            self.claimed = True
        else:
            self.refused = outcome


async def _answer(outcome: Outcome, send: Send) -> None:
    """The answer to a request whose claim was refused."""
    if isinstance(outcome, Mismatch):
        await _send_problem(
            send,
            422,
            "idempotency-key-reused",
            "Idempotency-Key reused",
            "this Idempotency-Key was used with a different request",
        )
    elif isinstance(outcome, InFlight):
        await _send_problem(
            send,
            409,
            "idempotency-key-in-flight",
            "Request in flight",
            "a request with this Idempotency-Key is still being processed; retry later",
            {"Retry-After": "1"},
        )
    else:
        assert isinstance(outcome, Replay)
        headers = [(k.encode(), v.encode()) for k, v in outcome.headers]
        headers += [
            (b"content-length", str(len(outcome.body)).encode()),
            (b"idempotent-replayed", b"true"),
        ]
        await send(
            {"type": "http.response.start", "status": outcome.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": outcome.body})
