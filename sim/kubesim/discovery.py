"""Discovery documents: ``/version``, ``/api``, ``/apis``, resource lists and OpenAPI v3.

Clients learn what a cluster serves from these: the dynamic client and
``kubectl`` map kinds to resources through the legacy (unaggregated) discovery
lists; ``kubectl`` checks ``/openapi/v3`` for the ``fieldValidation`` parameter
of each kind's PATCH operation before it trusts the server to validate
strictly. The OpenAPI documents carry the CRD schemas (so ``kubectl explain``
works on Kueue kinds) but deliberately no built-in schemas, which makes
``kubectl`` fall back to its compiled-in types for strategic merge.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from sim.kubesim.resources import ResourceType

__all__ = ["Discovery"]

KUBE_VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0-kubesim"}
_ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_STATUS_VERBS = ["get", "patch", "update"]


#: Kubernetes version-priority order (``v1`` > ``v1beta2`` > ``v1beta1`` > ``v1alpha2``).
def _priority(version: str) -> tuple[int, int, int]:
    import re

    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not match:
        return (0, 0, 0)
    stage = {"alpha": 1, "beta": 2, None: 3}[match[2]]
    return (stage, int(match[1]), int(match[3] or 0))


class Discovery:
    """Pre-rendered discovery bodies for one set of resource types."""

    def __init__(self, types: Iterable[ResourceType]) -> None:
        self.types = tuple(types)
        self.groups: dict[str, list[str]] = {}
        for rtype in self.types:
            versions = self.groups.setdefault(rtype.group, [])
            for version in rtype.versions:
                if version.name not in versions:
                    versions.append(version.name)
        for versions in self.groups.values():
            versions.sort(key=_priority, reverse=True)
        self._resource_lists: dict[tuple[str, str], bytes] = {}
        self._openapi: dict[tuple[str, str], bytes] = {}

    def version(self) -> dict[str, Any]:
        return {
            **KUBE_VERSION,
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.23.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def core_versions(self, address: str) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
        }

    def _group(self, name: str) -> dict[str, Any]:
        versions = [{"groupVersion": f"{name}/{v}", "version": v} for v in self.groups[name]]
        return {"name": name, "versions": versions, "preferredVersion": versions[0]}

    def group_list(self) -> dict[str, Any]:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self._group(name) for name in sorted(self.groups) if name],
        }

    def group(self, name: str) -> dict[str, Any] | None:
        if name not in self.groups or not name:
            return None
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group(name)}

    def resource_list(self, group: str, version: str) -> bytes | None:
        key = (group, version)
        if key not in self._resource_lists:
            if version not in self.groups.get(group, ()):
                return None
            group_version = f"{group}/{version}" if group else version
            resources: list[dict[str, Any]] = []
            for rtype in self.types:
                if rtype.group == group and rtype.serves(version):
                    resources.extend(_api_resources(rtype))
            body = {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": resources,
            }
            self._resource_lists[key] = json.dumps(body).encode()
        return self._resource_lists[key]

    # -- OpenAPI v3 ------------------------------------------------------------------------

    def openapi_index(self) -> dict[str, Any]:
        paths = {}
        for group, versions in self.groups.items():
            for version in versions:
                path = f"api/{version}" if not group else f"apis/{group}/{version}"
                digest = (
                    hashlib.sha256(self.openapi(group, version) or b"").hexdigest()[:16].upper()
                )
                paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
        return {"paths": paths}

    def openapi(self, group: str, version: str) -> bytes | None:
        key = (group, version)
        if key not in self._openapi:
            if version not in self.groups.get(group, ()):
                return None
            self._openapi[key] = json.dumps(self._openapi_doc(group, version)).encode()
        return self._openapi[key]

    def _openapi_doc(self, group: str, version: str) -> dict[str, Any]:
        paths: dict[str, Any] = {}
        schemas: dict[str, Any] = {}
        for rtype in self.types:
            if rtype.group != group or not rtype.serves(version):
                continue
            gvk = {"group": group, "version": version, "kind": rtype.kind}
            prefix = f"/api/{version}" if not group else f"/apis/{group}/{version}"
            scope = "/namespaces/{namespace}" if rtype.namespaced else ""
            item = f"{prefix}{scope}/{rtype.plural}/{{name}}"
            paths[item] = {"patch": _patch_operation(rtype, gvk), "get": _get_operation(gvk)}
            schema = (rtype.version(version) or None) and rtype.version(version).schema  # type: ignore[union-attr]
            if schema and not rtype.builtin:
                name = f"{_reverse_group(group)}.{version}.{rtype.kind}"
                schemas[name] = {**schema, "x-kubernetes-group-version-kind": [gvk]}
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": KUBE_VERSION["gitVersion"]},
            "paths": paths,
            "components": {"schemas": schemas},
        }


def _reverse_group(group: str) -> str:
    return ".".join(reversed(group.split("."))) if group else "io.k8s.api.core"


def _query(name: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}


def _patch_operation(rtype: ResourceType, gvk: dict[str, str]) -> dict[str, Any]:
    return {
        "operationId": f"patch{rtype.kind}",
        "parameters": [_query(p) for p in ("dryRun", "fieldManager", "fieldValidation", "force")],
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": gvk,
        "responses": {"200": {"description": "OK"}},
    }


def _get_operation(gvk: dict[str, str]) -> dict[str, Any]:
    return {
        "x-kubernetes-action": "get",
        "x-kubernetes-group-version-kind": gvk,
        "responses": {"200": {"description": "OK"}},
    }


def _api_resources(rtype: ResourceType) -> list[dict[str, Any]]:
    main: dict[str, Any] = {
        "name": rtype.plural,
        "singularName": rtype.singular,
        "namespaced": rtype.namespaced,
        "kind": rtype.kind,
        "verbs": _ALL_VERBS,
    }
    if rtype.short_names:
        main["shortNames"] = list(rtype.short_names)
    if rtype.categories:
        main["categories"] = list(rtype.categories)
    resources = [main]
    if rtype.has_status:
        resources.append(
            {
                "name": f"{rtype.plural}/status",
                "singularName": "",
                "namespaced": rtype.namespaced,
                "kind": rtype.kind,
                "verbs": _STATUS_VERBS,
            }
        )
    if rtype.scale is not None:
        resources.append(
            {
                "name": f"{rtype.plural}/scale",
                "singularName": "",
                "namespaced": rtype.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": _STATUS_VERBS,
            }
        )
    return resources
