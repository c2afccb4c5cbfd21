"""RFC 9457 problem details: the one shape of every error the API returns."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://quartermaster.dev/problems/"


def problem(status: int, kind: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    body = {"type": TYPE_BASE + kind, "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON)
