"""``apply`` of a Volcano ``Queue``: the ClusterQueue it maps to, by the rule
in docs/volcano.md, or a refusal naming the field and the rule.

A Volcano Queue (``scheduling.volcano.sh/v1beta1``) is a share of one
cluster; a ClusterQueue is a quota of the fleet, per flavor and resource:

- ``deserved`` → ``nominalQuota``;
- ``capability`` → the ceiling: ``borrowingLimit`` = capability - deserved
  (none where capability leaves a resource out: Volcano leaves it unlimited);
- ``guarantee.resource`` → ``lendingLimit`` = deserved - guarantee (what is
  guaranteed is never lent); ``reclaimable: false`` → ``lendingLimit: 0``;
- ``weight`` → ``fairSharing.weight``;
- the flavor: the annotation ``quartermaster.dev/flavor``, else the only
  ResourceFlavor there is; the cohort: ``quartermaster.dev/cohort``.

Refused, as Volcano's queue webhook refuses them, when guarantee > deserved
or deserved > capability; and when the mapping cannot be made: no quota at
all, no flavor to name, limits without a cohort, a parent queue.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from quartermaster_client.models import API_VERSION

API_GROUP = "scheduling.volcano.sh"
QUEUE_API_VERSION = f"{API_GROUP}/v1beta1"
FLAVOR_ANNOTATION = "quartermaster.dev/flavor"
COHORT_ANNOTATION = "quartermaster.dev/cohort"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
#: Volcano Queue fields with no ClusterQueue meaning: noted, not mapped.
UNMAPPED = {
    "affinity": "pods are placed by their flavor's node labels and the island",
    "extendClusters": "the centre chooses the cluster for every gang",
    "type": "a queue has no type here",
    "dequeueStrategy": "gangs are ordered by the ClusterQueue's queueingStrategy",
    "priority": "queues are not ranked against one another; their gangs' priorities are",
}
_SCALE: dict[str, Fraction] = {
    "": Fraction(1),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{
        s: Fraction(2 ** (10 * (i + 1))) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))
    },
}
_QUANTITY = re.compile(r"^(?P<number>[+-]?(\d+\.?\d*|\.\d+))(?P<suffix>[a-zA-Z]*)$")


class QueueRefused(ValueError):
    """A Volcano Queue that maps to no ClusterQueue: the field and why."""

    def __init__(self, name: str, field: str, message: str) -> None:
        super().__init__(f"Volcano Queue {name}: {field}: {message} (docs/volcano.md)")
        self.field = field


def is_volcano_queue(body: Mapping[str, Any]) -> bool:
    return body.get("apiVersion") == QUEUE_API_VERSION and body.get("kind") == "Queue"


def _quantity(name: str, field: str, value: Any) -> Fraction:
    match = _QUANTITY.match(str(value)) if isinstance(value, int | str) else None
    if match is None or match["suffix"] not in _SCALE or isinstance(value, bool):
        raise QueueRefused(name, field, f"{value!r} is not a quantity")
    return Fraction(match["number"]) * _SCALE[match["suffix"]]


def _written(amount: Fraction, like: Any) -> int | str:
    """``amount`` in the unit of ``like`` where it is whole in it, else in
    base units (milli-units when not whole)."""
    match = _QUANTITY.match(str(like))
    suffix = match["suffix"] if match else ""
    scaled = amount / _SCALE.get(suffix, Fraction(1))
    if scaled.denominator == 1:
        return int(scaled) if not suffix else f"{int(scaled)}{suffix}"
    if amount.denominator == 1:
        return int(amount)
    return f"{int(amount * 1000)}m"


def _resources(name: str, spec: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = spec.get(key) if key != "guarantee" else (spec.get(key) or {}).get("resource")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        field = "spec.guarantee.resource" if key == "guarantee" else f"spec.{key}"
        raise QueueRefused(name, field, "must be a map of resource to quantity")
    return dict(value)


def _flavor(name: str, annotations: Mapping[str, Any], flavors: Callable[[], list[str]]) -> str:
    named = annotations.get(FLAVOR_ANNOTATION)
    if named:
        return str(named)
    known = flavors()
    if len(known) == 1:
        return known[0]
    field = f"metadata.annotations.{FLAVOR_ANNOTATION}"
    found = ", ".join(known) or "none"
    raise QueueRefused(
        name, field, f"name the ResourceFlavor its quota is of (there are {len(known)}: {found})"
    )


def _quota(name: str, spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One quota per resource the Queue names, in the order it names them."""
    deserved = _resources(name, spec, "deserved")
    capability = _resources(name, spec, "capability")
    guarantee = _resources(name, spec, "guarantee")
    if not deserved and not capability:
        raise QueueRefused(
            name,
            "spec.deserved",
            "a Queue with neither deserved nor capability shares by weight alone; "
            "a ClusterQueue needs a quota (deserved → nominalQuota)",
        )
    closed = spec.get("reclaimable") is False
    out = []
    for resource in dict.fromkeys([*deserved, *capability, *guarantee]):
        nominal = _quantity(name, f"spec.deserved.{resource}", deserved.get(resource, 0))
        quota: dict[str, Any] = {"name": resource, "nominalQuota": deserved.get(resource, 0)}
        if resource in guarantee:
            least = _quantity(name, f"spec.guarantee.resource.{resource}", guarantee[resource])
            if least > nominal:
                raise QueueRefused(
                    name, f"spec.deserved.{resource}", "must be >= guarantee (Volcano's rule)"
                )
            quota["lendingLimit"] = _written(nominal - least, guarantee[resource])
        if resource in capability:
            most = _quantity(name, f"spec.capability.{resource}", capability[resource])
            if nominal > most:
                raise QueueRefused(
                    name, f"spec.deserved.{resource}", "must be <= capability (Volcano's rule)"
                )
            quota["borrowingLimit"] = _written(most - nominal, capability[resource])
        if closed:
            quota["lendingLimit"] = 0
        out.append(quota)
    return out


def volcano_queue_to_cluster_queue(
    body: Mapping[str, Any], flavors: Callable[[], list[str]]
) -> tuple[dict[str, Any], list[str]]:
    """The ClusterQueue a Volcano Queue maps to, and notes on what was not
    mapped; ``flavors`` lists the ResourceFlavors (asked only when the
    Queue's annotation names none). QueueRefused when it maps to none."""
    metadata = dict(body.get("metadata") or {})
    name = str(metadata.get("name") or "")
    annotations = {
        k: v for k, v in dict(metadata.get("annotations") or {}).items() if k != LAST_APPLIED
    }
    spec = body.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise QueueRefused(name, "spec", "must be an object")
    parent = spec.get("parent")
    if parent not in (None, "", "root"):
        raise QueueRefused(
            name,
            "spec.parent",
            "a parent queue is a Cohort here: apply it as one and name it in the "
            f"annotation {COHORT_ANNOTATION}",
        )
    quotas = _quota(name, spec)
    cohort = annotations.get(COHORT_ANNOTATION)
    if not cohort and any("borrowingLimit" in q or "lendingLimit" in q for q in quotas):
        raise QueueRefused(
            name,
            f"metadata.annotations.{COHORT_ANNOTATION}",
            "capability above deserved is borrowed, and guarantee or reclaimable limit "
            "lending, from a cohort: name the Cohort its queues share",
        )
    flavor = _flavor(name, annotations, flavors)
    cq_spec: dict[str, Any] = {
        # A Volcano Queue takes jobs of every namespace.
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": [q["name"] for q in quotas],
                "flavors": [{"name": flavor, "resources": quotas}],
            }
        ],
        "fairSharing": {"weight": spec.get("weight", 1)},
    }
    if cohort:
        cq_spec["cohortName"] = cohort
    kept = {k: metadata[k] for k in ("name", "labels") if metadata.get(k)}
    if annotations:
        kept["annotations"] = annotations
    notes = [
        f"Queue {name}: spec.{field} is not mapped: {why}"
        for field, why in UNMAPPED.items()
        if spec.get(field) is not None
    ]
    cluster_queue = {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": kept,
        "spec": cq_spec,
    }
    return cluster_queue, notes
