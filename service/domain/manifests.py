"""Kueue-shaped manifests (``v1beta2`` field names) → domain values.

Each ``*_from_manifest`` accepts either a full object
(``{apiVersion, kind, metadata: {name, namespace, labels}, spec}``) or the
flattened form used in fleet and scenario files (``{name, <spec fields>}``).
Pure functions over plain mappings, so the API, the fleet loader and the test
scenarios share one reading of every field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from service.domain.quantity import canonical_amount, parse_quantity
from service.domain.quota import (
    WORKLOAD_CLASSES,
    BorrowWithinCohort,
    ClusterQueue,
    Cohort,
    FlavorFungibility,
    FlavorQuotas,
    LabelSelector,
    LabelSelectorRequirement,
    LocalQueue,
    PreemptionBudget,
    PreemptionPolicy,
    PreemptionProtection,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Taint,
    Toleration,
    Topology,
    WorkloadClass,
    WorkloadPriorityClass,
)

__all__ = [
    "MIXED_ISLANDS_LABEL",
    "WORKLOAD_CLASS_LABEL",
    "ManifestError",
    "cluster_queue_from_manifest",
    "cohort_from_manifest",
    "label_selector_from_manifest",
    "local_queue_from_manifest",
    "priority_class_from_manifest",
    "resource_flavor_from_manifest",
    "taint_from_manifest",
    "toleration_from_manifest",
    "topology_from_manifest",
]

#: ClusterQueue label that sets its workload class (``training`` | ``inference``).
WORKLOAD_CLASS_LABEL = "quartermaster.dev/workload-class"
#: On a ClusterQueue: ``"true"`` lets its workloads share islands with the other class.
MIXED_ISLANDS_LABEL = "quartermaster.dev/mixed-islands"

Manifest = Mapping[str, Any]


class ManifestError(ValueError):
    """A manifest is malformed or uses a value outside the v1beta2 enums."""


def _spec(obj: Manifest) -> tuple[str, Mapping[str, Any], Mapping[str, Any]]:
    """Return ``(name, metadata, spec)`` from the full or the flattened form."""
    if "spec" in obj or "metadata" in obj:
        metadata = cast(Mapping[str, Any], obj.get("metadata") or {})
        name = metadata.get("name") or obj.get("name")
        spec = cast(Mapping[str, Any], obj.get("spec") or {})
    else:
        metadata = cast(Mapping[str, Any], obj.get("metadata") or {})
        name = obj.get("name")
        spec = obj
    if not name or not isinstance(name, str):
        raise ManifestError(f"object without a name: {dict(obj)!r}")
    if "labels" in obj and "labels" not in metadata:
        metadata = {**metadata, "labels": obj["labels"]}
    return name, metadata, spec


def _enum(value: Any, allowed: Sequence[str], what: str) -> Any:
    if value not in allowed:
        raise ManifestError(f"{what}: {value!r} is not one of {list(allowed)}")
    return value


def _weight_milli(spec: Mapping[str, Any]) -> int:
    fair = spec.get("fairSharing") or {}
    weight = fair.get("weight", 1)
    return int(parse_quantity(weight) * 1000)


def taint_from_manifest(obj: Manifest) -> Taint:
    effect = _enum(
        obj.get("effect", "NoSchedule"), ("NoSchedule", "PreferNoSchedule", "NoExecute"), "effect"
    )
    return Taint(key=str(obj["key"]), value=str(obj.get("value", "")), effect=effect)


def toleration_from_manifest(obj: Manifest) -> Toleration:
    operator = _enum(obj.get("operator", "Equal"), ("Equal", "Exists"), "operator")
    return Toleration(
        key=str(obj.get("key", "")),
        operator=operator,
        value=str(obj.get("value", "")),
        effect=str(obj.get("effect", "")),
    )


def label_selector_from_manifest(obj: Manifest | None) -> LabelSelector | None:
    """``None`` stays ``None`` (Kueue's nil: nothing); ``{}`` matches everything."""
    if obj is None:
        return None
    expressions = tuple(
        LabelSelectorRequirement(
            key=str(e["key"]),
            operator=_enum(e["operator"], ("In", "NotIn", "Exists", "DoesNotExist"), "operator"),
            values=tuple(str(v) for v in e.get("values") or ()),
        )
        for e in obj.get("matchExpressions") or ()
    )
    labels = {str(k): str(v) for k, v in (obj.get("matchLabels") or {}).items()}
    return LabelSelector(match_labels=labels, match_expressions=expressions)


def topology_from_manifest(obj: Manifest) -> Topology:
    name, _, spec = _spec(obj)
    levels = tuple(
        str(level["nodeLabel"]) if isinstance(level, Mapping) else str(level)
        for level in spec.get("levels") or ()
    )
    if not levels:
        raise ManifestError(f"topology {name}: no levels")
    return Topology(name=name, levels=levels)


def resource_flavor_from_manifest(obj: Manifest) -> ResourceFlavor:
    name, _, spec = _spec(obj)
    return ResourceFlavor(
        name=name,
        node_labels={str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()},
        node_taints=tuple(taint_from_manifest(t) for t in spec.get("nodeTaints") or ()),
        tolerations=tuple(toleration_from_manifest(t) for t in spec.get("tolerations") or ()),
        topology_name=spec.get("topologyName"),
    )


def _optional_amount(resource: str, value: Any) -> int | None:
    return None if value is None else canonical_amount(resource, value)


def _resource_groups(spec: Mapping[str, Any]) -> tuple[ResourceGroup, ...]:
    groups = []
    for group in spec.get("resourceGroups") or ():
        covered = tuple(str(r) for r in group.get("coveredResources") or ())
        flavors = []
        for flavor in group.get("flavors") or ():
            resources = {}
            for res in flavor.get("resources") or ():
                rname = str(res["name"])
                resources[rname] = ResourceQuota(
                    nominal=canonical_amount(rname, res.get("nominalQuota", 0)),
                    borrowing_limit=_optional_amount(rname, res.get("borrowingLimit")),
                    lending_limit=_optional_amount(rname, res.get("lendingLimit")),
                )
            if not covered:
                covered = tuple(resources)
            flavors.append(FlavorQuotas(name=str(flavor["name"]), resources=resources))
        groups.append(ResourceGroup(covered_resources=covered, flavors=tuple(flavors)))
    return tuple(groups)


def cohort_from_manifest(obj: Manifest) -> Cohort:
    name, _, spec = _spec(obj)
    return Cohort(
        name=name,
        parent_name=spec.get("parentName"),
        resource_groups=_resource_groups(spec),
        fair_weight_milli=_weight_milli(spec),
    )


def _preemption(obj: Mapping[str, Any]) -> PreemptionPolicy:
    borrow = obj.get("borrowWithinCohort") or {}
    return PreemptionPolicy(
        within_cluster_queue=_enum(
            obj.get("withinClusterQueue", "Never"),
            ("Never", "LowerPriority", "LowerOrNewerEqualPriority"),
            "withinClusterQueue",
        ),
        reclaim_within_cohort=_enum(
            obj.get("reclaimWithinCohort", "Never"),
            ("Never", "LowerPriority", "Any"),
            "reclaimWithinCohort",
        ),
        borrow_within_cohort=BorrowWithinCohort(
            policy=_enum(borrow.get("policy", "Never"), ("Never", "LowerPriority"), "policy"),
            max_priority_threshold=borrow.get("maxPriorityThreshold"),
        ),
        protection=_protection(obj.get("protection") or {}),
        budget=_budget(obj.get("budget")),
    )


def _protection(obj: Mapping[str, Any]) -> PreemptionProtection:
    grace = obj.get("islandGangGraceSeconds")
    return PreemptionProtection(
        min_runtime_seconds=_non_negative(obj.get("minRuntimeSeconds", 0), "minRuntimeSeconds"),
        reclaim_nominal=_enum(
            obj.get("reclaimNominal", "Immediate"), ("Immediate", "Protected"), "reclaimNominal"
        ),
        island_gang_grace_seconds=(
            None if grace is None else _non_negative(grace, "islandGangGraceSeconds")
        ),
    )


def _budget(obj: Mapping[str, Any] | None) -> PreemptionBudget | None:
    if obj is None:
        return None
    preemptions = _non_negative(obj.get("preemptions"), "budget.preemptions")
    period = _non_negative(obj.get("periodSeconds"), "budget.periodSeconds")
    if period == 0:
        raise ManifestError("budget.periodSeconds: must be positive")
    return PreemptionBudget(preemptions=preemptions, period_seconds=period)


def _non_negative(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ManifestError(f"{what}: {value!r} is not a non-negative integer")
    return value


def _fungibility(obj: Mapping[str, Any]) -> FlavorFungibility:
    actions = ("MayStopSearch", "TryNextFlavor")
    result = FlavorFungibility(
        when_can_borrow=_enum(obj.get("whenCanBorrow", "MayStopSearch"), actions, "whenCanBorrow"),
        when_can_preempt=_enum(
            obj.get("whenCanPreempt", "TryNextFlavor"), actions, "whenCanPreempt"
        ),
        preference=None
        if obj.get("preference") is None
        else _enum(
            obj["preference"],
            ("BorrowingOverPreemption", "PreemptionOverBorrowing"),
            "preference",
        ),
    )
    if result.preference is not None and (
        result.when_can_borrow != "TryNextFlavor" or result.when_can_preempt != "TryNextFlavor"
    ):
        raise ManifestError(
            "preference can only be set when both whenCanBorrow and whenCanPreempt"
            " are TryNextFlavor"
        )
    return result


def cluster_queue_from_manifest(obj: Manifest) -> ClusterQueue:
    """A ClusterQueue; an absent ``namespaceSelector`` is Kueue's nil (no namespace)."""
    name, metadata, spec = _spec(obj)
    labels = metadata.get("labels") or {}
    workload_class = cast(
        WorkloadClass,
        _enum(labels.get(WORKLOAD_CLASS_LABEL, "training"), WORKLOAD_CLASSES, "workload class"),
    )
    scope = spec.get("admissionScope") or {}
    return ClusterQueue(
        name=name,
        resource_groups=_resource_groups(spec),
        cohort_name=spec.get("cohortName") or spec.get("cohort"),
        preemption=_preemption(spec.get("preemption") or {}),
        flavor_fungibility=_fungibility(spec.get("flavorFungibility") or {}),
        queueing_strategy=_enum(
            spec.get("queueingStrategy", "BestEffortFIFO"),
            ("StrictFIFO", "BestEffortFIFO"),
            "queueingStrategy",
        ),
        namespace_selector=label_selector_from_manifest(spec.get("namespaceSelector")),
        stop_policy=_enum(
            spec.get("stopPolicy", "None"), ("None", "Hold", "HoldAndDrain"), "stopPolicy"
        ),
        fair_weight_milli=_weight_milli(spec),
        workload_class=workload_class,
        mixed_islands=labels.get(MIXED_ISLANDS_LABEL) == "true",
        admission_fair_sharing=scope.get("admissionMode", "UsageBasedAdmissionFairSharing")
        != "NoAdmissionFairSharing",
    )


def local_queue_from_manifest(obj: Manifest, namespace: str | None = None) -> LocalQueue:
    name, metadata, spec = _spec(obj)
    ns = namespace or metadata.get("namespace") or obj.get("namespace")
    if not ns:
        raise ManifestError(f"local queue {name}: no namespace")
    return LocalQueue(
        namespace=str(ns),
        name=name,
        cluster_queue=str(spec["clusterQueue"]),
        stop_policy=_enum(
            spec.get("stopPolicy", "None"), ("None", "Hold", "HoldAndDrain"), "stopPolicy"
        ),
        fair_weight_milli=_weight_milli(spec),
    )


def priority_class_from_manifest(obj: Manifest) -> WorkloadPriorityClass:
    """WorkloadPriorityClass keeps ``value`` at the top level, like Kueue."""
    name, _, spec = _spec(obj)
    value = obj.get("value", spec.get("value"))
    if not isinstance(value, int):
        raise ManifestError(f"priority class {name}: value must be an integer")
    return WorkloadPriorityClass(
        name=name, value=value, description=str(obj.get("description", ""))
    )
