"""What every page shares: the templates, the signed-in viewer, the page
registry that builds the navigation, and errors rendered as pages.

A page is a :class:`Page`: a router of its own (``service/console/pages/``)
and the roles that may open it — those the API requires for what it reads —
so that the navigation never offers what the API would refuse.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import jinja2
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from service.api.deps import container, current_principal
from service.app.auth import Principal, Role
from service.app.bootstrap import Services
from service.app.resources import Actor
from service.console.config import ConsoleSettings
from service.console.gate import SESSION_KEY
from service.console.session import Session
from service.domain.quantity import format_amount

HERE = Path(__file__).parent
STATIC = HERE / "static"


@dataclass(frozen=True)
class Page:
    """One page of the console: its navigation entry and its routes."""

    title: str
    path: str
    """Below the console's prefix, e.g. ``/fleet``."""
    readers: frozenset[Role]
    router: APIRouter


@dataclass(frozen=True)
class Viewer:
    """The signed-in person, as every page and fragment sees them."""

    principal: Principal
    session: Session
    request_id: str | None
    base: str
    pages: Sequence[Page]

    @property
    def actor(self) -> Actor:
        return Actor(self.principal, self.request_id)

    @property
    def nav(self) -> list[Page]:
        return [p for p in self.pages if self.principal.has(p.readers)]

    def may(self, roles: frozenset[Role]) -> bool:
        return self.principal.has(roles)


async def viewer(
    request: Request, principal: Annotated[Principal, Depends(current_principal)]
) -> Viewer:
    session: Session = request.scope[SESSION_KEY]
    return Viewer(
        principal,
        session,
        request.headers.get("x-request-id"),
        request.scope.get("root_path", ""),
        request.app.state.console_pages,
    )


def settings_of(request: Request) -> ConsoleSettings:
    found: ConsoleSettings = request.app.state.console_settings
    return found


CurrentViewer = Annotated[Viewer, Depends(viewer)]
Services_ = Annotated[Services, Depends(container)]
Settings_ = Annotated[ConsoleSettings, Depends(settings_of)]


# -- templates -----------------------------------------------------------------------------


def age(moment: datetime | str | None, now: datetime | None = None) -> str:
    """How long ago, as ``kubectl`` says it: 42s, 5m, 3h, 2d."""
    if moment is None or moment == "":
        return "-"
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    seconds = max(0, int(((now or datetime.now(UTC)) - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def percent(part: float, whole: float) -> int:
    return 0 if whole <= 0 else max(0, min(100, round(100 * part / whole)))


@cache
def asset_version(name: str) -> str:
    """A short digest of a static file, so that a changed asset is fetched anew."""
    return hashlib.sha256((STATIC / name).read_bytes()).hexdigest()[:12]


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.ChainableUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["age"] = age
    env.filters["amount"] = lambda n, resource: format_amount(resource, int(n))
    env.globals["percent"] = percent
    env.globals["inf"] = float("inf")
    env.globals["asset_version"] = asset_version
    return env


def render_bytes(name: str, context: dict[str, Any]) -> bytes:
    """A template outside any page (the gate's answers): no viewer, no nav."""
    full = {"base": "/ui", "viewer": None, "title": None, **context}
    return environment().get_template(name).render(full).encode()


def render(
    viewer: Viewer | None,
    name: str,
    context: dict[str, Any],
    status: int = 200,
    base: str | None = None,
) -> HTMLResponse:
    full = {
        "base": viewer.base if viewer is not None else (base or "/ui"),
        "viewer": viewer,
        "title": None,
        **context,
    }
    page = environment().get_template(name).render(full)
    return HTMLResponse(page, status_code=status, headers={"Cache-Control": "no-store"})
