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
        """``status title: detail``, then a line per field at fault; each said
        once, though a detail often repeats them (a submission's lists them all)."""
        lines = [str(e) for e in self.errors]
        detail = self.detail
        if lines:
            said = {*lines, *(e.message for e in self.errors)}
            said |= {e.field or "(body)" for e in self.errors}
            detail = _unrepeated(detail, said)
            detail = "" if detail.lower() in self.title.lower() else detail
        if detail:
            text = f"{self.status} {self.title}: {detail}"
        else:
            text = f"{self.status} {self.title}" if lines else self.title
        return text + "".join(f"\n  {line}" for line in lines)


def _unrepeated(detail: str, said: set[str]) -> str:
    """The detail without what the field lines say: "" when it is one of them,
    its head when its tail is them joined by "; " or ", " ("… is invalid: a; b")."""
    if detail in said:
        return ""
    head, colon, tail = detail.partition(": ")
    while colon:
        for separator in ("; ", ", "):
            if all(part in said for part in tail.split(separator)):
                return head
        more, colon, tail = tail.partition(": ")
        head = f"{head}: {more}"
    return detail


class BadRequest(ApiError):
    """400: the body is not JSON or YAML, or is missing."""


class Unauthorized(ApiError):
    """401: no bearer token, or one the server does not know."""


class Forbidden(ApiError):
    """403: the caller's role does not allow this."""


class NotFound(ApiError):
    """404: no such object."""


class MethodNotAllowed(ApiError):
    """405: the path does not take this method."""


class Conflict(ApiError):
    """409: the object exists, changed since it was read, is in use, or
    a request with the same Idempotency-Key is still running."""


class AlreadyExists(Conflict):
    """409: an object of that name exists."""


class BeingDeleted(Conflict):
    """409: a deleted object of that name is still being finalized (a
    Cluster whose objects on the member are still being removed)."""


class StaleVersion(Conflict):
    """409: the object changed since it was read (resourceVersion / If-Match)."""


class InUse(Conflict):
    """409: something still depends on the object."""


class IdempotencyKeyInFlight(Conflict):
    """409: the first request with this Idempotency-Key is still running."""


class PayloadTooLarge(ApiError):
    """413: the body is over the server's limit."""


class UnsupportedMediaType(ApiError):
    """415: the body is neither JSON nor YAML."""


class Invalid(ApiError):
    """422: the object is invalid; ``errors`` names every field at fault."""


class PolicyRefused(Invalid):
    """422: the workload breaks its ClusterQueue's security floor; ``errors`` lists every rule."""


class UnknownReference(Invalid):
    """422: a queue, flavor, priority class or ClusterQueue named does not exist."""


class UnsupportedKind(Invalid):
    """422: not a Workload nor a job manifest of a kind the service accepts."""


class IdempotencyKeyReused(Invalid):
    """422: this Idempotency-Key was used with a different request."""


class RateLimited(ApiError):
    @property
    def retry_after(self) -> float | None:
        return retry_after(self.headers)


class ServerError(ApiError):
    """5xx: the server failed; nothing acknowledged was lost, a retry is safe."""


class ServiceUnavailable(ServerError):
    """503: the database is unreachable or a setting is missing; retry later."""


_BY_TYPE: dict[str, type[ApiError]] = {
    "already-exists": AlreadyExists,
    "being-deleted": BeingDeleted,
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
    "BeingDeleted",
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
