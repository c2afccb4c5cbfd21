"""The API verbs with Kubernetes object semantics, independent of HTTP.

One :class:`ApiCore` per simulated cluster. The HTTP layer and the in-cluster
controllers both write through it, so a controller's status update obeys the
same rules (validation, managedFields, resourceVersion, no-op detection) as a
client's. The order of a write mirrors the real API server: decode and check
identity → strategy preparation and defaulting → pruning of unknown fields
(``fieldValidation``) → mutating admission → validation (schema, CEL, strategy)
→ field ownership → storage (skipped for ``dryRun`` and for no-op updates,
which keep their resourceVersion as etcd's guaranteed update doe

:mod:`.core` holds the verbs, :mod:`.metadata` the server's side of identity and
metadata, :mod:`.paging` what a list returns, :mod:`.context` what every verb is given.
"""

from __future__ import annotations

from sim.kubesim.api.context import (
    APPLY_PATCH,
    APPLY_PATCH_CBOR,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Admission,
    Context,
    Resource,
    now_rfc3339,
)
from sim.kubesim.api.core import ApiCore
from sim.kubesim.api.paging import selectable_value

__all__ = [
    "APPLY_PATCH",
    "APPLY_PATCH_CBOR",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_PATCH",
    "Admission",
    "ApiCore",
    "Context",
    "Resource",
    "now_rfc3339",
    "selectable_value",
]
