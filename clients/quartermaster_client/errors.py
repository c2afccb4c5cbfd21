"""Errors as exceptions: every API error carries its problem+json fields
(RFC 9457: ``type``, ``title``, ``status``, ``detail``, ``errors``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

PROBLEM_BASE = "https://quartermaster.dev/problems/"


class QuartermasterError(Exception):
    """The root of every error this package raises."""


class ConfigError(QuartermasterError):
    """No server or token could be found, or the contexts file is broken."""


class TransportError(QuartermasterError):
    """The server could not be reached (after retries)."""


class WatchTimeout(QuartermasterError):
    """A wait ended before the workload reached a final state."""


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field or '(body)'}: {self.message}"


class ApiError(QuartermasterError):
    """An answer with status >= 400. ``problem_type`` is the short type
    (``not-found``, ``stale-version``, ...); ``type`` the full URI."""

    status: int = 0

    def __init__(
        self,
        status: int,
        type: str,
        title: str,
        detail: str,
        errors: list[FieldError],
        body: Any = None,
        headers: httpx.Headers | None = None,
        method: str = "",
        url: str = "",
    ) -> None:
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.errors = errors
        self.body = body
        self.headers = headers if headers is not None else httpx.Headers()
        self.method = method
        self.url = url
        super().__init__(self._message())

    @property
    def problem_type(self) -> str:
        return self.type.removeprefix(PROBLEM_BASE)

    def _message(self) -> str:
        text = f"{self.status} {self.title}: {self.detail}" if self.detail else self.title
        if self.errors:
            text += "".join(f"\n  {e}" for e in self.errors)
        return text


class BadRequest(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Forbidden(ApiError):
    pass


class NotFound(ApiError):
    pass


class MethodNotAllowed(ApiError):
    pass


class Conflict(ApiError):
    """409: the object exists, changed since it was read, is in use, or
    a request with the same Idempotency-Key is still running."""


class AlreadyExists(Conflict):
    pass


class StaleVersion(Conflict):
    pass


class InUse(Conflict):
    pass


class IdempotencyKeyInFlight(Conflict):
    pass


class PayloadTooLarge(ApiError):
    pass


class UnsupportedMediaType(ApiError):
    pass


class Invalid(ApiError):
    """422: the object is invalid; ``errors`` names every field at fault."""


class PolicyRefused(Invalid):
    pass


class UnknownReference(Invalid):
    pass


class UnsupportedKind(Invalid):
    pass


class IdempotencyKeyReused(Invalid):
    pass


class RateLimited(ApiError):
    @property
    def retry_after(self) -> float | None:
        return retry_after(self.headers)


class ServerError(ApiError):
    pass


class ServiceUnavailable(ServerError):
    pass


_BY_TYPE: dict[str, type[ApiError]] = {
    "already-exists": AlreadyExists,
    "stale-version": StaleVersion,
    "in-use": InUse,
    "idempotency-key-in-flight": IdempotencyKeyInFlight,
    "policy-refused": PolicyRefused,
    "unknown-reference": UnknownReference,
    "unsupported-kind": UnsupportedKind,
    "idempotency-key-reused": IdempotencyKeyReused,
}
_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: Invalid,
    429: RateLimited,
    503: ServiceUnavailable,
}


def retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def error_for(response: httpx.Response, body: bytes | None = None) -> ApiError:
    """The exception for an error response, from its problem+json body (or
    whatever the body is, when a proxy answered instead of the API)."""
    raw = response.content if body is None else body
    try:
        parsed: Any = json.loads(raw) if raw else None
    except ValueError:
        parsed = None
    problem = parsed if isinstance(parsed, dict) else {}
    status = response.status_code
    type_ = str(problem.get("type") or "about:blank")
    errors = [
        FieldError(str(e.get("field", "")), str(e.get("message", "")))
        for e in problem.get("errors") or []
        if isinstance(e, dict)
    ]
    short = type_.removeprefix(PROBLEM_BASE)
    cls = _BY_TYPE.get(short) or _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ApiError
    try:
        request: httpx.Request | None = response.request
    except RuntimeError:
        request = None
    detail = problem.get("detail")
    if detail is None and not problem:
        detail = raw.decode("utf-8", "replace")[:500] if raw else ""
    return cls(
        status=status,
        type=type_,
        title=str(problem.get("title") or response.reason_phrase or "HTTP error"),
        detail=str(detail or ""),
        errors=errors,
        body=parsed,
        headers=response.headers,
        method=request.method if request is not None else "",
        url=str(request.url) if request is not None else "",
    )


__all__ = [
    "AlreadyExists",
    "ApiError",
    "BadRequest",
    "ConfigError",
    "Conflict",
    "FieldError",
    "Forbidden",
    "IdempotencyKeyInFlight",
    "IdempotencyKeyReused",
    "InUse",
    "Invalid",
    "MethodNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "PolicyRefused",
    "QuartermasterError",
    "RateLimited",
    "ServerError",
    "ServiceUnavailable",
    "StaleVersion",
    "TransportError",
    "Unauthorized",
    "UnknownReference",
    "UnsupportedKind",
    "UnsupportedMediaType",
    "WatchTimeout",
]
