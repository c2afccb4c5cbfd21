"""Dependencies every router uses: the services, the caller, the body."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import yaml
from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from service.api import limits
from service.app.auth import Principal, TokenService
from service.app.bootstrap import Services as Container
from service.app.errors import AppError, Invalid, Unauthorized
from service.app.resources import Actor
from service.jsonio import read_fast

#: Where the caller, once authenticated, is kept in the request's scope.
PRINCIPAL = "qm.principal"
JSON_TYPES = ("application/json", "application/merge-patch+json", "")
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")


class BadBody(AppError):
    status, kind, title = 400, "malformed-body", "Malformed body"


class TooLarge(AppError):
    status, kind, title = 413, "body-too-large", "Body too large"


class UnsupportedMedia(AppError):
    status, kind, title = 415, "unsupported-media-type", "Unsupported media type"


async def container(request: Request) -> Container:
    services: Container = request.app.state.container
    return services


async def current_principal(request: Request) -> Principal:
    """The one authentication dependency: every route that is not on the
    public allow-list depends on it (a test enforces that)."""
    # Kept in the scope, not request.state: a miss on State raises and
    # formats an AttributeError, which cost more than the rest of this.
    cached: Principal | None = request.scope.get(PRINCIPAL)
    if cached is not None:
        return cached
    header = request.headers.get("authorization", "")
    scheme, _, credential = header.partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        raise Unauthorized("a bearer token is required (Authorization: Bearer <token>)")
    authenticator: TokenService = request.app.state.container.authenticator
    principal = authenticator.cached(credential.strip())
    if principal is None:
        principal = await run_in_threadpool(authenticator.authenticate, credential.strip())
    request.scope[PRINCIPAL] = principal
    return principal


async def current_actor(
    request: Request, principal: Annotated[Principal, Depends(current_principal)]
) -> Actor:
    return Actor(principal, request.headers.get("x-request-id"))


CurrentActor = Annotated[Actor, Depends(current_actor)]
CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
Deps = Annotated[Container, Depends(container)]


async def read_body(request: Request, limit: int, max_items: int | None = None) -> Any:
    """The body as JSON or YAML, with errors that say what is wrong. Call
    it only once the caller is authorised: nothing is read before.

    Within limits (service/api/limits.py): YAML at most MAX_YAML_BYTES, with
    bounded aliases; nesting at most MAX_DEPTH; integers within 2^53-1; and
    with ``max_items``, a large bulk body's items counted before parsing."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media in YAML_TYPES:
        limit = min(limit, limits.MAX_YAML_BYTES)
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise TooLarge(f"the body is {length} bytes; the limit is {limit}")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise TooLarge(f"the body exceeds the limit of {limit} bytes")
    if not raw.strip():
        raise BadBody("the request needs a body", [("", "empty body")])
    data = bytes(raw)
    del raw
    if max_items is not None and media not in YAML_TYPES and len(data) > limits.SHAPE_CHECK_BYTES:
        _check_shape(data, max_items)
    if media in YAML_TYPES:
        body, clean = await run_in_threadpool(_parse, data, media)
    else:
        body, clean = _parse(data, media)
    if limits.may_exceed(data) and (found := limits.document_problem(body)) is not None:
        raise Invalid(f"the body is refused: {found[0] or '(body)'} {found[1]}", [found])
    return body if clean else _storable(body)


def _check_shape(data: bytes, max_items: int) -> None:
    depth, items = limits.bulk_shape(data, max_items)
    if depth > limits.MAX_DEPTH:
        raise BadBody(
            f"the body is nested deeper than {limits.MAX_DEPTH} levels",
            [("", f"nested deeper than {limits.MAX_DEPTH} levels")],
        )
    if items > max_items:
        raise Invalid(f"at most {max_items} items per request", [("items", "too many items")])


def _parse(raw: bytes, media: str) -> tuple[Any, bool]:
    """The body, and whether it is known to be storable as it is."""
    if media in YAML_TYPES:
        try:
            loaded = limits.load_yaml(raw)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise BadBody(f"malformed YAML{where}", [("", str(error))]) from None
        # As the API server does: YAML becomes JSON (timestamps as strings,
        # keys as strings), so that both media types mean the same.
        try:
            as_json = json.dumps(loaded, default=str).encode()
        except (TypeError, ValueError) as error:  # a key JSON cannot have (a date)
            raise BadBody(f"YAML that has no JSON form: {error}", [("", str(error))]) from None
        return _parse(as_json, "application/json")
    if media in JSON_TYPES or media.endswith("+json"):
        fast, document = read_fast(raw)
        if fast:
            # orjson accepts only valid UTF-8 without lone surrogates, so the
            # one thing Postgres could not store is an escaped NUL.
            return document, b"\\u0000" not in raw
        try:
            return json.loads(raw, parse_constant=_no_constant, parse_float=_finite), False
        except RecursionError:  # past orjson's 1,024 levels, json's recursion
            raise BadBody(
                f"the body is nested deeper than {limits.MAX_DEPTH} levels",
                [("", f"nested deeper than {limits.MAX_DEPTH} levels")],
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as error:
            raise BadBody(f"malformed JSON: {error}", [("", str(error))]) from None
    raise UnsupportedMedia(
        f"content type {media!r} is not supported; use application/json or application/yaml"
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    """A JSON number as a float, refusing one past the float range (``1e400``
    would become infinity, which no JSON document or JSONB column holds)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of range")
    return value


def _bad_text(text: str) -> str | None:
    if "\x00" in text:
        return "must not contain NUL characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (no lone surrogates)"
    return None


def _storable(body: Any) -> Any:
    """Postgres JSONB stores neither NUL characters nor lone surrogates;
    refuse them up front, naming where they are."""
    problems: list[tuple[str, str]] = []

    def walk(value: Any, path: str) -> None:
        if len(problems) >= 20:
            return
        if isinstance(value, str):
            if (why := _bad_text(value)) is not None:
                problems.append((path, why))
        elif isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and (why := _bad_text(key)) is not None:
                    problems.append((child, f"key {why}"))
                walk(item, child)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")

    walk(body, "")
    if problems:
        raise Invalid("the body contains text that cannot be stored", problems)
    return body
