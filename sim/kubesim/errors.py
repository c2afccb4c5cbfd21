"""Kubernetes ``Status`` error bodies, raised as exceptions and rendered in one place.

Clients branch on ``code`` and ``reason`` (the official client's ``ApiException``
carries both, ``kubectl`` prints ``Error from server (Reason): message``), so
every failure the stand-in produces goes through :class:`ApiError` with the
code, reason and message wording of the real API server
(``k8s.io/apimachinery/pkg/api/errors``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ApiError",
    "Cause",
    "already_exists",
    "bad_request",
    "conflict",
    "expired",
    "forbidden",
    "invalid",
    "method_not_allowed",
    "not_found",
    "not_served",
    "unauthorized",
    "unsupported_media_type",
]


@dataclass(frozen=True, slots=True)
class Cause:
    """One entry of ``details.causes``: what is wrong with which field."""

    reason: str
    message: str
    field: str = ""

    def as_dict(self) -> dict[str, str]:
        body = {"reason": self.reason, "message": self.message}
        if self.field:
            body["field"] = self.field
        return body


@dataclass(slots=True)
class ApiError(Exception):
    """A failed request, rendered as a ``v1.Status`` with ``status: Failure``."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    #: Render ``details: {}`` (a generic server response) rather than leaving it out.
    empty_details: bool = False

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def body(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details or self.empty_details:
            status["details"] = self.details
        return status


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def _details(resource: str, group: str, name: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name} if name else {}  # ``name,omitempty``
    details["kind"] = resource
    if group:
        details["group"] = group
    details.update(extra)
    return details


def not_found(resource: str, group: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{_qualified(resource, group)} "{name}" not found',
        _details(resource, group, name),
    )


def already_exists(resource: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(resource, group)} "{name}" already exists',
        _details(resource, group, name),
    )


def conflict(resource: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {why}',
        _details(resource, group, name),
    )


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> ApiError:
    """422 Invalid, worded like ``errors.NewInvalid``: ``Kind.group "name" is invalid: …``."""
    texts = [f"{c.field}: {c.message}" if c.field else c.message for c in causes]
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details: dict[str, Any] = {"name": name, "kind": kind, "causes": [c.as_dict() for c in causes]}
    if group:
        details["group"] = group
    return ApiError(
        422, "Invalid", f'{_qualified(kind, group)} "{name}" is invalid: {summary}', details
    )


def not_served() -> ApiError:
    """A path the server does not serve; its Status carries empty ``details``."""
    return ApiError(
        404, "NotFound", "the server could not find the requested resource", {}, empty_details=True
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def forbidden(resource: str, group: str, name: str, why: str) -> ApiError:
    subject = _qualified(resource, group)
    if name:
        subject = f'{subject} "{name}"'
    return ApiError(
        403, "Forbidden", f"{subject} is forbidden: {why}", _details(resource, group, name)
    )


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def method_not_allowed(message: str = "the server does not allow this method") -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str, accepted: list[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": content_type}]},
    )
