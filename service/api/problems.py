"""RFC 9457 problem details: the one shape of every error the API returns."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.routing import Match

from service.api.group_commit import DATABASE_DOWN
from service.api.indoubt import PENDING, OutcomeUnknown
from service.api.outage import RETRY_AFTER_SECONDS, Outage
from service.app.errors import AppError

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://quartermaster.dev/problems/"
log = logging.getLogger(__name__)


def problem(
    status: int,
    kind: str,
    title: str,
    detail: str,
    errors: Sequence[tuple[str, str]] = (),
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": TYPE_BASE + kind,
        "title": title,
        "status": status,
        "detail": detail,
        **extra,
    }
    if errors:
        body["errors"] = [{"field": field, "message": message} for field, message in errors]
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _loc(loc: Sequence[Any]) -> str:
    parts = list(loc)
    if parts and parts[0] in ("query", "path", "header", "body"):
        parts = parts[1:]
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


_STATUS_KINDS = {
    404: ("not-found", "Not found"),
    405: ("method-not-allowed", "Method not allowed"),
    401: ("unauthorized", "Unauthorized"),
    403: ("forbidden", "Forbidden"),
}


def _allowed(app: FastAPI, request: Request) -> list[str]:
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def database_unavailable() -> JSONResponse:
    """The answer to a request the database's absence failed before it
    changed anything (an unknown outcome is ``outcome-unknown`` instead)."""
    return problem(
        503,
        "database-unavailable",
        "Database unavailable",
        "the database cannot be reached; retry shortly",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def _outage(request: Request) -> Outage:
    outage: Outage = request.app.state.outage
    return outage


def install(app: FastAPI) -> None:
    app.state.outage = Outage()

    @app.exception_handler(AppError)
    async def app_error(request: Request, error: AppError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        if error.status == 503:
            headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        return problem(error.status, error.kind, error.title, error.detail, error.errors, headers)

    @app.exception_handler(OutcomeUnknown)
    async def outcome_unknown(request: Request, error: OutcomeUnknown) -> JSONResponse:
        # The Idempotency-Key middleware, if the request has a key, keeps
        # its claim and settles it from this error once Postgres answers.
        pending = request.scope.get(PENDING)
        if pending is not None:
            pending.append(error)
        _outage(request).failed(error.__cause__ or error)
        return await app_error(request, error)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = [(_loc(e["loc"]), e["msg"]) for e in error.errors()]
        fields = ", ".join(f or "(body)" for f, _ in errors)
        return problem(422, "invalid-request", "Invalid request", f"invalid: {fields}", errors)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        kind, title = _STATUS_KINDS.get(error.status_code, ("http-error", "HTTP error"))
        headers = dict(error.headers) if error.headers else None
        if error.status_code == 405:
            # Starlette names only the first route that matched the path;
            # list every method any route on this path accepts.
            headers = {**(headers or {}), "Allow": ", ".join(_allowed(app, request))}
        return problem(error.status_code, kind, title, str(error.detail), headers=headers)

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    @app.exception_handler(PoolTimeout)
    @app.exception_handler(psycopg.OperationalError)
    @app.exception_handler(psycopg.InterfaceError)
    async def database_down(request: Request, error: Exception) -> JSONResponse:
        # Logged once per outage, not per request; the pool reconnects.
        _outage(request).failed(error)
        return database_unavailable()

    @app.exception_handler(DataError)
    async def unstorable(request: Request, error: DataError) -> JSONResponse:
        # Input that validation let through but Postgres cannot hold or
        # compare (a value out of a column's range, say): the client's to fix.
        log.warning("data refused by the database on %s: %s", request.url.path, error.orig)
        return problem(422, "invalid-request", "Invalid request", f"refused: {error.orig}")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        # The handlers above answer what the routes raise; this one also
        # answers what a middleware raises (the Idempotency-Key store reads
        # Postgres before any route runs): the database down is 503 there too.
        if isinstance(error, DATABASE_DOWN):
            return await database_down(request, error)
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(500, "internal", "Internal error", "an unexpected error; it was logged")
