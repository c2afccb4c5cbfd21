"""What a real member cluster would refuse of an object we write: the Kueue
CRD's structural schema and CEL rules (``../shared/kueue-crds``, checked by
kubesim's validator, unknown fields rejected as with ``fieldValidation=Strict``)
and, for ClusterQueues, the rules Kueue's validating webhook adds
(``pkg/webhooks/clusterqueue_webhook.go``: a resource and a flavor in one
group only; each flavor lists the group's covered resources, in order, with
non-negative quotas; at most 256 flavors in all)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from service.domain.quantity import canonical_amount
from sim.kubesim.resources import kueue_types
from sim.kubesim.schema import SchemaValidator

_VERSION = "v1beta2"


def _validator(kind: str) -> SchemaValidator:
    for rtype in kueue_types():
        if rtype.kind == kind:
            version = rtype.version(_VERSION)
            assert version is not None and version.schema is not None
            return SchemaValidator(version.schema)
    raise KeyError(kind)


def problems(obj: Mapping[str, Any]) -> list[str]:
    """Why a Kueue object would be refused ([] when it would not be)."""
    assert obj["apiVersion"] == f"kueue.x-k8s.io/{_VERSION}", obj["apiVersion"]
    validator = _validator(str(obj["kind"]))
    body = copy.deepcopy(dict(obj))
    out = [f"unknown field {path}" for path in validator.prune(body)]
    validator.apply_defaults(body)
    out += [f"{c.field}: {c.message}" for c in validator.validate(body, None)]
    if obj["kind"] == "ClusterQueue":
        out += webhook_problems(obj)
    return out


def webhook_problems(queue: Mapping[str, Any]) -> list[str]:
    out = []
    seen_resources: set[str] = set()
    seen_flavors: set[str] = set()
    groups = queue["spec"].get("resourceGroups") or []
    for g, group in enumerate(groups):
        covered = list(group["coveredResources"])
        for resource in covered:
            if resource in seen_resources:
                out.append(f"resourceGroups[{g}]: resource {resource} in two groups")
            seen_resources.add(resource)
        for flavor in group["flavors"]:
            if flavor["name"] in seen_flavors:
                out.append(f"resourceGroups[{g}]: flavor {flavor['name']} in two groups")
            seen_flavors.add(flavor["name"])
            names = [r["name"] for r in flavor["resources"]]
            if names != covered:
                out.append(f"flavor {flavor['name']} lists {names}, not {covered}")
            for r in flavor["resources"]:
                if canonical_amount(r["name"], r["nominalQuota"]) < 0:
                    out.append(f"flavor {flavor['name']}: negative quota of {r['name']}")
    if len(seen_flavors) > 256:
        out.append(f"{len(seen_flavors)} flavors (at most 256)")
    return out
