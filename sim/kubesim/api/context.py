"""What every verb is given: the resource at its served version with its write
machinery, who asks with which write options, the patch media types, and the clock."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sim.kubesim.builtin import Strategy
from sim.kubesim.fieldmanager import FieldManager
from sim.kubesim.resources import ResourceType, Version
from sim.kubesim.schema import SchemaValidator

__all__ = [
    "APPLY_PATCH",
    "APPLY_PATCH_CBOR",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_PATCH",
    "Admission",
    "Context",
    "Resource",
    "now_rfc3339",
]

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
APPLY_PATCH_CBOR = "application/apply-patch+cbor"


def now_rfc3339() -> str:
    """The current second in RFC 3339 (formatted once a second: every write asks for it)."""
    return _format_second(int(time.time()))


@functools.lru_cache(maxsize=2)
def _format_second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class Context:
    """Who asks, and the write options of the request."""

    user: str = "system:admin"
    #: The user's groups (``request.userInfo.groups`` of an admission policy).
    groups: tuple[str, ...] = ("system:masters", "system:authenticated")
    manager: str = ""
    dry_run: bool = False
    field_validation: str = "Warn"
    warnings: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Resource:
    """A resource type at one served version, with its write machinery."""

    rtype: ResourceType
    version: Version
    strategy: Strategy
    validator: SchemaValidator | None
    fields: FieldManager
    #: ``group/version`` (``v1`` for the core group): asked for several times a write.
    api_version: str = field(init=False)

    def __post_init__(self) -> None:
        self.api_version = self.rtype.api_version(self.version.name)

    @property
    def group(self) -> str:
        return self.rtype.group

    @property
    def plural(self) -> str:
        return self.rtype.plural


Admission = Callable[[str, Resource, Obj, "Obj | None", Context], None]
"""An admission hook: operation, resource, new object, old object, context. On
``CREATE``/``UPDATE`` it may change the new object (mutating); on ``DELETE`` it gets
the object as stored and may only refuse (validating)."""
