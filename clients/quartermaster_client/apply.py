"""``apply``: Kueue manifests translated, and whether an object needs replacing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quartermaster_client.kinds import RUNTIME_KINDS
from quartermaster_client.models import API_VERSION, Resource

KUEUE_GROUP = "kueue.x-k8s.io/"
TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"
#: Object metadata that Quartermaster keeps; the rest (uid, resourceVersion,
#: managedFields, ownerReferences ...) belongs to the cluster it came from.
KEPT_METADATA = ("name", "namespace", "labels", "annotations")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
#: Kueue fields with no meaning in Quartermaster (admission checks run on
#: member clusters; Quartermaster admits one gang at a time per queue).
DROPPED: dict[str, tuple[str, ...]] = {
    "ClusterQueue": (
        "admissionChecks",
        "admissionChecksStrategy",
        "admissionScope",
        "concurrentAdmissionPolicy",
    ),
    "Workload": (
        "maximumExecutionTimeSeconds",
        "preemptionGates",
        "priority",
        "priorityClassSource",
    ),
}
#: Fields Kueue v1beta1 named otherwise (kueue.x-k8s.io/v1beta1 -> v1beta2).
RENAMED: dict[str, dict[str, str]] = {"ClusterQueue": {"cohort": "cohortName"}}


@dataclass(frozen=True)
class Applied:
    object: Resource
    action: str
    """created, configured or unchanged"""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # What the server warned of on the write (e.g. quota no node can use).
        self.notes.extend(w for w in self.object.warnings if w not in self.notes)


def kueue_to_quartermaster(body: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The Quartermaster form of a Kueue object (any other object is
    returned as it is), and notes on what was dropped."""
    out = dict(body)
    api_version = str(out.get("apiVersion", ""))
    if api_version == TRAINER_API_VERSION and out.get("kind") in RUNTIME_KINDS:
        out["apiVersion"] = API_VERSION  # served as ours, spec as Trainer writes it
        return out, []
    if not api_version.startswith(KUEUE_GROUP):
        return out, []
    kind = str(out.get("kind", ""))
    notes: list[str] = []
    out["apiVersion"] = API_VERSION
    metadata = dict(out.get("metadata") or {})
    kept = {k: metadata[k] for k in KEPT_METADATA if k in metadata}
    annotations = dict(kept.get("annotations") or {})
    if annotations.pop(LAST_APPLIED, None) is not None:
        kept["annotations"] = annotations
    if not kept.get("annotations"):
        kept.pop("annotations", None)
    out["metadata"] = kept
    out.pop("status", None)
    spec = dict(out.get("spec") or {})
    for old, new in RENAMED.get(kind, {}).items():
        if old in spec and new not in spec:
            spec[new] = spec.pop(old)
    for name in DROPPED.get(kind, ()):
        if name in spec:
            spec.pop(name)
            notes.append(f"{kind} {kept.get('name')}: spec.{name} has no Quartermaster meaning")
    if kind == "Workload" and isinstance(spec.get("priorityClassRef"), Mapping):
        spec["priorityClassName"] = spec.pop("priorityClassRef").get("name")
    if "spec" in out:
        out["spec"] = spec
    return out, notes


def differs(desired: Any, current: Any) -> bool:
    """Whether replacing ``current`` with ``desired`` would change it: every
    field of ``desired`` must be in ``current`` with the same value; fields
    ``desired`` leaves out are the server's defaults, and ``status`` is the
    server's own."""
    if isinstance(desired, Mapping):
        if not isinstance(current, Mapping):
            return True
        for key, value in desired.items():
            if key in ("status", "resourceVersion", "uid", "generation", "creationTimestamp"):
                continue
            if key not in current:
                if value in (None, {}, []):
                    continue
                return True
            if differs(value, current[key]):
                return True
        return False
    if isinstance(desired, list):
        if not isinstance(current, list) or len(desired) != len(current):
            return True
        return any(differs(d, c) for d, c in zip(desired, current, strict=True))
    if isinstance(desired, bool) or isinstance(current, bool):
        return desired is not current
    return bool(desired != current and str(desired) != str(current))


__all__ = ["Applied", "differs", "kueue_to_quartermaster"]
