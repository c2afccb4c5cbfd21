"""Live updates: the API's own event stream (``GET /v1/events?watch=true``,
service/api/events.py) served to the signed-in browser at ``/ui/events``.

The same function answers both, with the session's principal: the same
visibility (a submitter's stream holds its namespaces' events only), the same
resumption from ``Last-Event-ID`` (the browser's EventSource sends it when it
reconnects), the same end of the stream when the token is revoked. Pages
refresh a fragment when an event type they show arrives (htmx ``sse:<type>``
triggers); nothing polls. Each event is sent slimmed to what a trigger
needs — its position, type, kind, namespace and name — so that no page's
stream carries an object's state (a preemptor's admission names its
victims, of other namespaces too).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.routing import APIRoute

from service.api.events import events_router
from service.console.web import CurrentViewer, Services_, Settings_

NAMESPACE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
KIND = r"^[A-Za-z]+$"


def _api_watch() -> Callable[..., Awaitable[Any]]:
    for route in events_router().routes:
        if isinstance(route, APIRoute) and route.path == "/v1/events":
            endpoint: Callable[..., Awaitable[Any]] = route.endpoint
            return endpoint
    raise RuntimeError("the API has no /v1/events route")  # pragma: no cover


def live_router() -> APIRouter:
    watch = _api_watch()
    router = APIRouter()

    @router.get("/events")
    async def events(
        request: Request,
        viewer: CurrentViewer,
        services: Services_,
        settings: Settings_,
        after: Annotated[int, Query(ge=0)] = 0,
        namespace: Annotated[str | None, Query(max_length=63, pattern=NAMESPACE)] = None,
        workload: Annotated[str | None, Query(max_length=253, pattern=NAME)] = None,
        kind: Annotated[str | None, Query(max_length=63, pattern=KIND)] = None,
    ) -> Any:
        """Server-sent events after ``after`` (or the ``Last-Event-ID``)."""
        resumed = request.headers.get("last-event-id", "")
        response = await watch(
            request=request,
            principal=viewer.principal,
            deps=services,
            after=after,
            limit=100,
            namespace=namespace,
            workload=workload,
            kind=kind,
            type=None,
            watch=True,
            timeout_seconds=settings.console_stream_seconds,
            last_event_id=resumed if resumed.isdigit() and len(resumed) <= 20 else None,
        )
        response.body_iterator = slim(response.body_iterator)
        return response

    return router


_KEPT = ("kind", "namespace", "name")


def slim_frame(frame: bytes) -> bytes:
    """One server-sent event of the API's stream with only what names it."""
    if not frame.startswith(b"id: "):
        return frame  # retry, heartbeat, error: nothing of any object's state
    lines = frame.rstrip(b"\n").split(b"\n")
    return b"\n".join(_slim_line(line) for line in lines) + b"\n\n"


def _slim_line(line: bytes) -> bytes:
    if not line.startswith(b"data: "):
        return line
    event = json.loads(line[6:])
    data = event.get("data") or {}
    kept = {
        "position": event.get("position"),
        "type": event.get("type"),
        "data": {k: data[k] for k in _KEPT if k in data},
    }
    return b"data: " + json.dumps(kept, separators=(",", ":")).encode()


async def slim(frames: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    async for frame in frames:
        yield slim_frame(frame if isinstance(frame, bytes) else str(frame).encode())
