"""Submissions straight to their handler, past FastAPI's per-request machinery.

A submission is the one call clients make thousands of times a second, and
FastAPI's share of it was larger than the submission's own (routing tries
routes one by one, then dependency solving, the request wrapper, the
exception and exit-stack middleware).

This middleware, the innermost of ours (rate limits, Idempotency-Key and
metrics still see every request), sends a well-formed
``POST /v1/namespaces/{namespace}/workloads`` to the route's own handler
(``routes.submit_workload``), with the caller resolved by the route's own
dependency function, and answers what it raises with the app's own exception
handlers, as Starlette's ExceptionMiddleware would. Everything else, including
a namespace that the route's path parameter refuses, goes on to FastAPI: the
declared route stays the definition (OpenAPI, its authorization dependency,
its validation errors), and this only skips the work that route does not need.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.requests import Request

from service.api.deps import current_principal
from service.api.middleware import ASGIApp, Receive, Scope, Send
from service.api.routes import SUBMIT_PATH, submit_workload

#: What the route's ``NamespacePath`` accepts: a DNS label of 1 to 63 characters.
_SUBMIT = re.compile(r"/v1/namespaces/([a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)/workloads")


class SubmitFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._route: APIRoute | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = (
            _SUBMIT.fullmatch(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if match is None:
            await self.app(scope, receive, send)
            return
        fastapi: FastAPI = scope["app"]
        namespace = match.group(1)
        # What routing would have set: metrics label requests by the route.
        scope["route"] = self._route or self._find(fastapi)
        scope["endpoint"] = scope["route"].endpoint
        scope["path_params"] = {"namespace": namespace}
        request = Request(scope, receive, send)
        try:
            principal = await current_principal(request)
            response = await submit_workload(request, namespace, principal)
        except Exception as error:
            handler = _handler(fastapi, error)
            if handler is None:
                raise  # to ServerErrorMiddleware, as from any route
            response = handler(request, error)
            if inspect.isawaitable(response):
                response = await response
        await response(scope, receive, send)

    def _find(self, app: FastAPI) -> APIRoute:
        """The declared route (routing sets the original route in the scope)."""
        self._route = next(
            route
            for route in (context.original_route for context in iter_route_contexts(app.routes))
            if isinstance(route, APIRoute)
            and route.path == SUBMIT_PATH
            and "POST" in (route.methods or ())
        )
        return self._route


def _handler(app: FastAPI, error: Exception) -> Any:
    """The app's handler for ``error``, looked up along its classes as
    Starlette does; None for the catch-all, which is ServerErrorMiddleware's."""
    for cls in type(error).__mro__:
        if cls is Exception:
            return None
        handler = app.exception_handlers.get(cls)
        if handler is not None:
            return handler
    return None
