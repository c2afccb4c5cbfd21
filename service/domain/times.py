"""Timestamps as Kubernetes and the read models write them: RFC 3339 in UTC,
to the second; and their reading, tolerant of a missing zone or value."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["parse_time", "rfc3339"]


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """``value`` as an aware datetime (UTC when it names no zone); None when
    it is empty or not a timestamp."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
