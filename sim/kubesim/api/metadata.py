"""The server's side of an object's identity and metadata: apiVersion, kind, namespace
and name checked against the URL, the metadata only the server sets, preconditions,
and the stored form of an update (status and spec split by subresource)."""

from __future__ import annotations

import random
from typing import Any

from sim.kubesim import errors
from sim.kubesim.api.context import Resource
from sim.kubesim.errors import Cause
from sim.kubesim.store import clone

__all__ = [
    "META_KNOWN",
    "MODIFIED",
    "SERVER_METADATA",
    "check_delete_preconditions",
    "check_identity",
    "check_preconditions",
    "comparable",
    "content",
    "generate_suffix",
    "merge_update",
]

Obj = dict[str, Any]

_NAME_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"
#: Metadata the server owns: a client's value is ignored on create and update.
SERVER_METADATA = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "selfLink",
)
META_KNOWN = (
    "name",
    "generateName",
    "namespace",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "managedFields",
    "resourceVersion",
    *SERVER_METADATA,
)


MODIFIED = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def generate_suffix() -> str:
    return "".join(random.choice(_NAME_SUFFIX_CHARS) for _ in range(5))


def content(obj: Obj) -> Obj:
    """The parts of an object whose change bumps ``metadata.generation``."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def comparable(obj: Obj) -> Obj:
    metadata = {
        k: v for k, v in obj["metadata"].items() if k not in ("managedFields", "resourceVersion")
    }
    return {**obj, "metadata": metadata}


def check_identity(resource: Resource, obj: Obj, namespace: str, name: str = "") -> None:
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if api_version and api_version != resource.api_version:
        raise errors.bad_request(
            f"the API version in the data ({api_version}) does not match the expected API "
            f"version ({resource.api_version})"
        )
    if kind and kind != resource.rtype.kind:
        raise errors.bad_request(
            f"the kind in the data ({kind}) does not match the expected kind "
            f"({resource.rtype.kind})"
        )
    obj["apiVersion"], obj["kind"] = resource.api_version, resource.rtype.kind
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        metadata = obj["metadata"] = {}
    if resource.rtype.namespaced:
        if metadata.get("namespace") and metadata["namespace"] != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent "
                "on the request"
            )
        metadata["namespace"] = namespace
    else:
        metadata.pop("namespace", None)
    if name:
        if metadata.get("name") and metadata["name"] != name:
            raise errors.bad_request(
                "the name of the object "
                f"({metadata['name']}) does not match the name on the URL ({name})"
            )
        metadata["name"] = name


def check_preconditions(resource: Resource, old: Obj, obj: Obj, *, require_rv: bool) -> None:
    metadata = obj["metadata"]
    name = old["metadata"]["name"]
    uid = metadata.get("uid")
    if uid and uid != old["metadata"]["uid"]:
        raise errors.conflict(
            resource.plural,
            resource.group,
            name,
            f"Precondition failed: UID in precondition: {uid}, "
            f"UID in object meta: {old['metadata']['uid']}",
        )
    rv = metadata.get("resourceVersion")
    if rv and rv != old["metadata"]["resourceVersion"]:
        raise errors.conflict(
            resource.plural,
            resource.group,
            name,
            MODIFIED,
        )
    if not rv and require_rv:
        raise errors.invalid(
            resource.rtype.kind,
            resource.group,
            name,
            [
                Cause(
                    "FieldValueInvalid",
                    "Invalid value: 0x0: must be specified for an update",
                    "metadata.resourceVersion",
                )
            ],
        )


def merge_update(resource: Resource, old: Obj, obj: Obj, subresource: str) -> Obj:
    """The stored form of an update: server metadata kept, status/spec split by subresource."""
    if subresource == "status":
        new = clone(old)
        if "status" in obj:
            new["status"] = obj["status"]
        else:
            new.pop("status", None)
        new["apiVersion"] = resource.api_version
        return new
    new = obj
    metadata = new["metadata"]
    for key in SERVER_METADATA:
        if key in old["metadata"]:
            metadata[key] = old["metadata"][key]
        else:
            metadata.pop(key, None)
    metadata["managedFields"] = old["metadata"].get("managedFields")
    if not metadata["managedFields"]:
        metadata.pop("managedFields")
    if "generateName" in old["metadata"]:
        metadata["generateName"] = old["metadata"]["generateName"]
    if resource.rtype.has_status:
        if "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)
    return new


def check_delete_preconditions(resource: Resource, old: Obj, preconditions: dict[str, Any]) -> None:
    uid, rv = preconditions.get("uid"), preconditions.get("resourceVersion")
    name = old["metadata"]["name"]
    if uid and uid != old["metadata"]["uid"]:
        raise errors.conflict(
            resource.plural,
            resource.group,
            name,
            f"Precondition failed: UID in precondition: {uid}, "
            f"UID in object meta: {old['metadata']['uid']}",
        )
    if rv and rv != old["metadata"]["resourceVersion"]:
        raise errors.conflict(
            resource.plural,
            resource.group,
            name,
            f"Precondition failed: ResourceVersion in precondition: {rv}, "
            f"ResourceVersion in object meta: {old['metadata']['resourceVersion']}",
        )
