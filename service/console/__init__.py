"""The web console, served by the API itself at ``/ui``.

Server-rendered pages (Jinja2) with htmx and its SSE extension, every asset
served from ``static/`` (docs/adr/0001-console-stack.md says why). Pages read
through the same ``service.app`` calls as the API's routes, as the same
principal: the session cookie is turned into the API's bearer header by
:class:`~service.console.gate.ConsoleGate`, so authentication, rate limits
and role checks are the API's own.

``install(app)`` is the one call the API's composition root makes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from service.app.errors import AppError
from service.console.config import ConsoleSettings
from service.console.gate import ROOT_KEY, ConsoleGate, Scope
from service.console.live import live_router
from service.console.pages import PAGES
from service.console.pages.auth import auth_router
from service.console.session import COOKIE, SessionCodec, cookie_is_secure, set_cookie_header
from service.console.web import STATIC, render, render_bytes

PREFIX = "/ui"
#: Open without a session (below the prefix); static assets are too.
PUBLIC = frozenset({"/signin"})


def console_app(state: Any, settings: ConsoleSettings) -> FastAPI:
    """The console as an app of its own (no OpenAPI), sharing the API's state."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.state = state
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.include_router(auth_router())
    app.include_router(live_router())
    for page in PAGES:
        app.include_router(page.router)

    @app.exception_handler(AppError)
    async def app_error(request: Request, error: AppError) -> Response:
        context = {"status": error.status, "title": error.title, "detail": error.detail}
        context["errors"] = list(error.errors)
        return render(None, "error.html", context, error.status, base=_base(request))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> Response:
        problems = [
            (".".join(str(p) for p in e.get("loc", ())[1:]), str(e.get("msg")))
            for e in error.errors()
        ]
        context = {"status": 422, "title": "Invalid request", "detail": "", "errors": problems}
        return render(None, "error.html", context, 422, base=_base(request))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> Response:
        context = {"status": error.status_code, "title": str(error.detail), "detail": ""}
        return render(None, "error.html", context, error.status_code, base=_base(request))

    return app


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", PREFIX))


def install(app: FastAPI, settings: ConsoleSettings | None = None) -> FastAPI:
    """Mount the console at ``/ui`` and put its gate outermost (call it after
    every other middleware is added); answers ``app``."""
    settings = settings or ConsoleSettings()
    services = app.state.container
    hours = settings.console_session_hours
    codec = SessionCodec(services.settings.secret_key, int(hours * 3600))
    app.state.console_sessions = codec
    app.state.console_settings = settings
    app.state.console_pages = PAGES
    app.mount(PREFIX, console_app(app.state, settings), name="console")

    def clear_cookie(scope: Scope) -> str:
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        client = scope.get("client")
        secure = cookie_is_secure(
            str(scope.get("scheme", "http")),
            str(client[0]) if client else None,
            headers.get(b"host", b"").decode("latin-1"),
            settings.console_insecure_localhost,
        )
        return set_cookie_header(COOKIE, "", scope.get(ROOT_KEY, "") + PREFIX, 0, secure)

    app.add_middleware(
        ConsoleGate,
        prefix=PREFIX,
        codec=codec,
        render=render_bytes,
        public=PUBLIC,
        clear_cookie=clear_cookie,
    )
    return app


__all__ = ["PREFIX", "install"]
