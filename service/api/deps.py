"""Dependencies every router uses: the services, the caller, the body."""

from __future__ import annotations

import json
from typing import Annotated, Any

import yaml
from fastapi import Depends, Request

from service.app.auth import Principal
from service.app.bootstrap import Services as Container
from service.app.errors import AppError, Unauthorized
from service.app.resources import Actor

JSON_TYPES = ("application/json", "application/merge-patch+json", "")
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")


class BadBody(AppError):
    status, kind, title = 400, "malformed-body", "Malformed body"


class TooLarge(AppError):
    status, kind, title = 413, "body-too-large", "Body too large"


class UnsupportedMedia(AppError):
    status, kind, title = 415, "unsupported-media-type", "Unsupported media type"


def container(request: Request) -> Container:
    services: Container = request.app.state.container
    return services


def current_principal(request: Request) -> Principal:
    """The one authentication dependency: every route that is not on the
    public allow-list depends on it (a test enforces that)."""
    cached: Principal | None = getattr(request.state, "principal", None)
    if cached is not None:
        return cached
    header = request.headers.get("authorization", "")
    scheme, _, credential = header.partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        raise Unauthorized("a bearer token is required (Authorization: Bearer <token>)")
    principal = container(request).authenticator.authenticate(credential.strip())
    request.state.principal = principal
    return principal


def current_actor(
    request: Request, principal: Annotated[Principal, Depends(current_principal)]
) -> Actor:
    return Actor(principal, request.headers.get("x-request-id"))


CurrentActor = Annotated[Actor, Depends(current_actor)]
CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
Deps = Annotated[Container, Depends(container)]


async def read_body(request: Request, limit: int) -> Any:
    """The body as JSON or YAML, with errors that say what is wrong."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise TooLarge(f"the body is {length} bytes; the limit is {limit}")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise TooLarge(f"the body exceeds the limit of {limit} bytes")
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not raw.strip():
        raise BadBody("the request needs a body", [("", "empty body")])
    if media in YAML_TYPES:
        try:
            return yaml.safe_load(bytes(raw))
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise BadBody(f"malformed YAML{where}", [("", str(error))]) from None
    if media in JSON_TYPES or media.endswith("+json"):
        try:
            return json.loads(bytes(raw))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise BadBody(f"malformed JSON: {error}", [("", str(error))]) from None
    raise UnsupportedMedia(
        f"content type {media!r} is not supported; use application/json or application/yaml"
    )
