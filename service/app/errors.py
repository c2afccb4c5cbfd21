"""Errors of the application layer; the API maps each to problem+json."""

from __future__ import annotations

from collections.abc import Sequence


class AppError(Exception):
    status = 400
    kind = "bad-request"
    title = "Bad request"

    def __init__(self, detail: str, errors: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = list(errors)


class Invalid(AppError):
    status, kind, title = 422, "invalid", "Invalid object"


class PolicyRefused(AppError):
    status, kind, title = 422, "policy-refused", "Refused by the security policy"


class UnknownReference(AppError):
    status, kind, title = 422, "unknown-reference", "Unknown reference"


class NotFound(AppError):
    status, kind, title = 404, "not-found", "Not found"


class AlreadyExists(AppError):
    status, kind, title = 409, "already-exists", "Already exists"


class BeingDeleted(AppError):
    """A name still held by a deleted object that is being finalized (as
    Kubernetes refuses to re-create a namespace while it is terminating)."""

    status, kind, title = 409, "being-deleted", "Object is being deleted"


class StaleVersion(AppError):
    status, kind, title = 409, "stale-version", "Stale resourceVersion"


class InUse(AppError):
    status, kind, title = 409, "in-use", "Still in use"


class Unauthorized(AppError):
    status, kind, title = 401, "unauthorized", "Unauthorized"


class Forbidden(AppError):
    status, kind, title = 403, "forbidden", "Forbidden"


class UnsupportedKind(AppError):
    status, kind, title = 422, "unsupported-kind", "Unsupported kind"
