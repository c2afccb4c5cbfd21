"""Which objects a list returns: selectors, the state at a resourceVersion and the
``continue`` tokens of paged lists, which expire as the real server's do."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from sim.kubesim import errors
from sim.kubesim.errors import ApiError
from sim.kubesim.selectors import FieldSelector, LabelSelector, field_value
from sim.kubesim.store import Collection

__all__ = ["after", "decode_continue", "encode_continue", "matches", "selectable_value", "state_at"]

Obj = dict[str, Any]


def state_at(collection: Collection, rv: int, *, continued: bool) -> dict[tuple[str, str], Obj]:
    try:
        return collection.state_at(rv)
    except ApiError:
        if continued:
            raise errors.expired(
                "The provided continue parameter is too old to display a consistent list "
                "result. You can start a new list without the continue parameter, or use the "
                "continue token in this response to retrieve the remainder of the results. "
                "Continuing with the provided token results in an inconsistent list - objects "
                "that were created, modified, or deleted between the time the first chunk was "
                "returned and now may show up in the list."
            ) from None
        raise


def matches(
    obj: Obj,
    labels: LabelSelector | None,
    fields: FieldSelector | None,
) -> bool:
    if (
        labels is not None
        and not labels.empty
        and not labels.matches(obj["metadata"].get("labels"))
    ):
        return False
    if fields is not None and not fields.empty:
        return fields.matches(obj, selectable_value)
    return True


def after(key: tuple[str, str], start: str) -> bool:
    return not start or f"{key[0]}/{key[1]}" > start


def encode_continue(rv: int, start: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError):
        raise errors.bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion"
        ) from None


def selectable_value(obj: Mapping[str, Any], path: str) -> str:
    """A field selector's view of ``obj`` (``source`` on events means the component)."""
    if path == "source":
        return field_value(obj, "source.component")
    return field_value(obj, path)
