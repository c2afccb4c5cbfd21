"""Live updates: the API's own event stream (``GET /v1/events?watch=true``,
service/api/events.py) served to the signed-in browser at ``/ui/events``.

The same function answers both, with the session's principal: the same
visibility (a submitter's stream holds its namespaces' events only), the same
resumption from ``Last-Event-ID`` (the browser's EventSource sends it when it
reconnects), the same end of the stream when the token is revoked. Pages
refresh a fragment when an event type they show arrives (htmx ``sse:<type>``
triggers); nothing polls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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
        return await watch(
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

    return router
