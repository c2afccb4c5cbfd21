"""``/v1/events``: the log after a position, or a server-sent event stream
that resumes from ``Last-Event-ID``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from service.api.deps import CurrentPrincipal, Deps
from service.app.auth import Role, require
from service.app.errors import AppError
from service.app.events import EventFilter

EVERYONE = frozenset(Role)
HEARTBEAT_SECONDS = 15.0
POLL_SECONDS = 0.2
IDLE_SECONDS = 60.0


class EventHead:
    """One poller per process of the log's head position, however many
    watchers: a watcher queries its filtered events only after the head has
    moved, instead of every watcher polling the database on its own."""

    def __init__(self, read_head: Callable[[], int]) -> None:
        self._read_head = read_head
        self._position = -1
        self._moved = asyncio.Event()
        self._running = False
        self._task: asyncio.Task[None] | None = None
        self._last_wait = 0.0

    @property
    def position(self) -> int:
        return self._position

    async def wait_beyond(self, position: int, timeout: float) -> None:
        """Return once the head is past ``position``, or after ``timeout``."""
        self._last_wait = time.monotonic()
        if not self._running:
            self._running = True
            self._task = asyncio.get_running_loop().create_task(self._poll())
        with anyio.move_on_after(timeout):
            while self._position <= position:
                await self._moved.wait()

    async def _poll(self) -> None:
        try:
            # Stops a minute after the last watcher asked; the next one restarts it.
            while time.monotonic() - self._last_wait < IDLE_SECONDS:
                try:
                    head = await anyio.to_thread.run_sync(self._read_head)
                except Exception:  # the database is away: watchers wait, then retry
                    head = self._position
                if head != self._position:
                    self._position = head
                    moved, self._moved = self._moved, asyncio.Event()
                    moved.set()
                await anyio.sleep(POLL_SECONDS)
        finally:
            self._running = False


def events_router() -> APIRouter:
    router = APIRouter(tags=["Event"])

    @router.get("/v1/events/head")
    async def head(principal: CurrentPrincipal, deps: Deps) -> Any:
        """The position of the newest event: where a watch that wants only
        what happens from now on starts."""
        require(principal, EVERYONE)
        head = await anyio.to_thread.run_sync(lambda: deps.event_queries.head(durable=True))
        return {"position": head}

    @router.get("/v1/events")
    async def events(
        request: Request,
        principal: CurrentPrincipal,
        deps: Deps,
        after: Annotated[int, Query(ge=0, description="List events after this position")] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        namespace: Annotated[str | None, Query(max_length=63)] = None,
        workload: Annotated[str | None, Query(max_length=253)] = None,
        kind: Annotated[str | None, Query(max_length=63)] = None,
        type: Annotated[str | None, Query(max_length=63)] = None,
        watch: Annotated[bool, Query(description="Stream as server-sent events")] = False,
        timeout_seconds: Annotated[
            float, Query(alias="timeoutSeconds", gt=0, le=3600, description="End a watch after")
        ] = 300,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=20)] = None,
    ) -> Any:
        """Events after a position; with ``watch=true`` a resumable SSE stream."""
        require(principal, EVERYONE)
        wanted = EventFilter(namespace, workload, kind, type)
        queries = deps.event_queries
        if not watch:
            items = await anyio.to_thread.run_sync(queries.after, principal, after, wanted, limit)
            last = items[-1]["position"] if items else after
            return {"items": items, "next": last}
        start = after
        if last_event_id and last_event_id.isdigit():
            start = max(start, int(last_event_id))

        tail: EventHead = request.app.state.event_head

        credential = request.headers.get("authorization", "").partition(" ")[2].strip()
        authenticator = deps.authenticator

        async def revoked() -> str | None:
            """Why the stream's token no longer holds (revoked, expired), or None."""
            try:
                await anyio.to_thread.run_sync(authenticator.authenticate, credential)
            except AppError as error:
                return error.detail
            return None

        async def stream() -> AsyncIterator[bytes]:
            position, deadline = start, time.monotonic() + timeout_seconds
            beat = time.monotonic() + HEARTBEAT_SECONDS
            checked = time.monotonic()
            seen = position
            yield b"retry: 1000\n\n"
            while time.monotonic() < deadline:
                if await request.is_disconnected():
                    return
                # A stream outlives no revocation by more than a token's cache.
                if time.monotonic() - checked >= authenticator.CACHE_SECONDS:
                    checked = time.monotonic()
                    why = await revoked()
                    if why is not None:
                        yield f"event: error\ndata: {json.dumps({'detail': why})}\n\n".encode()
                        return
                batch = await anyio.to_thread.run_sync(
                    queries.after, principal, position, wanted, 500
                )
                for event in batch:
                    position = event["position"]
                    payload = json.dumps(event, separators=(",", ":"))
                    yield f"id: {position}\nevent: {event['type']}\ndata: {payload}\n\n".encode()
                if not batch:
                    if time.monotonic() > beat:
                        beat = time.monotonic() + HEARTBEAT_SECONDS
                        yield b": heartbeat\n\n"
                    # Until the log grows past what this watcher has seen (the
                    # new events may all be filtered out: then it waits again).
                    await tail.wait_beyond(max(position, seen), 1.0)
                    seen = max(seen, tail.position)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return router
