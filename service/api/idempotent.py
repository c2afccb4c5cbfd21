"""The Idempotency-Key middleware (Stripe's and the IETF draft's semantics;
the store is service/app/idempotency.py).

A key is scoped by the authenticated principal, so that one token however
its Authorization header is spelt is one caller, and two callers never see
each other's answers. The request's body is not buffered here: the key is
claimed once the route has read it (after authorising), and the response
is stored before it is sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

from service.api.deps import PRINCIPAL
from service.api.group_commit import DATABASE_DOWN, GroupCommit
from service.api.indoubt import PENDING, OutcomeUnknown
from service.api.middleware import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    has_body,
    header,
    send_problem,
)
from service.app.auth import Principal
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


def principal_key(scope: Scope) -> str:
    """Whose keys a request's is among: its authenticated principal's key
    (``Principal.key``: a token's unique name, an OIDC subject), however its
    Authorization header is spelt. AuthenticateMiddleware, outside this one,
    has authenticated every write; a request it did not see (this middleware
    composed without it) is scoped by its credential's text, hashed."""
    principal: Principal | None = scope.get(PRINCIPAL)
    if principal is not None:
        return principal.key
    auth = header(scope, b"authorization") or ""
    return "credential:" + hashlib.sha256(auth.encode()).hexdigest()[:32]


_KEEP_HEADERS = {b"content-type", b"etag", b"location", b"warning"}
#: The methods a key applies to: every write (a PUT or DELETE with
#: If-Match is not idempotent in its answer: its retry would meet 409 or 404).
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


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
        key = header(scope, b"idempotency-key") if scope["type"] == "http" else None
        if key is None or scope["method"] not in WRITE_METHODS:
            await self.app(scope, receive, send)
            return
        if not 1 <= len(key) <= 255:
            await send_problem(
                send,
                400,
                "bad-idempotency-key",
                "Bad Idempotency-Key",
                "an Idempotency-Key is 1 to 255 characters",
            )
            return
        principal = principal_key(scope)
        claim = _Claim(self._claims, principal, key, scope)
        if not has_body(scope):
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
        result = await unknown.later()
        if result is None:
            await self._retrying(lambda: self.store.release(principal, key))
            return
        rendered = await unknown.render(result)
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
        await send_problem(
            send,
            422,
            "idempotency-key-reused",
            "Idempotency-Key reused",
            "this Idempotency-Key was used with a different request",
        )
    elif isinstance(outcome, InFlight):
        await send_problem(
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
        if outcome.status_code not in (204, 304):  # which carry no Content-Length
            headers.append((b"content-length", str(len(outcome.body)).encode()))
        headers.append((b"idempotent-replayed", b"true"))
        await send(
            {"type": "http.response.start", "status": outcome.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": outcome.body})
