"""Signing in and out. The form's token reaches ``POST /signin`` as the
``Authorization`` header (the gate moves it there), so it is authenticated
and rate-limited as any bearer token; once it is, it is sealed in the
session cookie, never shown to the page's scripts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response

from service.api.deps import current_principal
from service.app.auth import Principal
from service.console.gate import parse_form
from service.console.session import (
    COOKIE,
    SIGNIN_COOKIE,
    Session,
    SessionCodec,
    cookie_is_secure,
    new_csrf,
    set_cookie_header,
)
from service.console.web import CurrentViewer, Settings_, render

REFUSED = "That token was refused: it is unknown, revoked or expired."


def secure_for(request: Request, insecure_localhost: bool) -> bool:
    client = request.client.host if request.client else None
    return cookie_is_secure(
        request.url.scheme, client, request.headers.get("host", ""), insecure_localhost
    )


def safe_next(base: str, target: str | None) -> str:
    """Where to go after signing in: a console path only (no open redirect)."""
    path = target or ""
    foreign = path.startswith("//") or "\\" in path or "://" in path
    return path if path.startswith(base + "/") and not foreign else base + "/"


def clear(name: str, path: str, secure: bool) -> str:
    return set_cookie_header(name, "", path, 0, secure)


def auth_router() -> APIRouter:
    router = APIRouter()

    @router.get("/signin")
    async def sign_in_form(
        request: Request, settings: Settings_, next: str = "", refused: str = ""
    ) -> Response:
        """The sign-in form (public), with its double-submit CSRF cookie."""
        base = request.scope.get("root_path", "")
        csrf = new_csrf()
        error = REFUSED if refused else None
        page = render(None, "signin.html", {"csrf": csrf, "next": next, "error": error}, base=base)
        secure = secure_for(request, settings.console_insecure_localhost)
        page.headers.append(
            "set-cookie", set_cookie_header(SIGNIN_COOKIE, csrf, f"{base}/signin", 900, secure)
        )
        return page

    @router.post("/signin")
    async def sign_in(
        request: Request,
        principal: Annotated[Principal, Depends(current_principal)],
        settings: Settings_,
    ) -> Response:
        """The token was authenticated on the way in; seal it in the session."""
        base = request.scope.get("root_path", "")
        form = parse_form(await request.body(), {b"content-type": _kind(request)})
        token = request.headers["authorization"].partition(" ")[2]
        codec: SessionCodec = request.app.state.console_sessions
        secure = secure_for(request, settings.console_insecure_localhost)
        answer = RedirectResponse(safe_next(base, form.get("next")), status_code=303)
        sealed = codec.seal(Session(token, new_csrf()))
        answer.headers.append(
            "set-cookie", set_cookie_header(COOKIE, sealed, base or "/", codec.max_age, secure)
        )
        answer.headers.append("set-cookie", clear(SIGNIN_COOKIE, f"{base}/signin", secure))
        return answer

    @router.post("/signout")
    async def sign_out(request: Request, viewer: CurrentViewer, settings: Settings_) -> Response:
        """End the session here (the cookie is dropped; the token itself stays valid)."""
        secure = secure_for(request, settings.console_insecure_localhost)
        answer = RedirectResponse(f"{viewer.base}/signin", status_code=303)
        answer.headers.append("set-cookie", clear(COOKIE, viewer.base or "/", secure))
        return answer

    @router.get("/")
    async def home(viewer: CurrentViewer) -> Response:
        first = viewer.nav[0].path if viewer.nav else "/workloads"
        return RedirectResponse(viewer.base + first, status_code=303)

    return router


def _kind(request: Request) -> bytes:
    return request.headers.get("content-type", "").encode("latin-1")
