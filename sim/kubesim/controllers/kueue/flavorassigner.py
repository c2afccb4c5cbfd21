"""Whether a ResourceFlavor suits a pod set (taints, node selector and affinity) and, for
a pod set that asks for a topology level, the domain with room for all its pods."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from sim.kubesim.controllers.base import pod_requests
from sim.kubesim.controllers.kueue.workload import PREFERRED_TOPOLOGY, REQUIRED_TOPOLOGY
from sim.kubesim.controllers.nodes import matches_node, node_ready, tolerates

__all__ = ["Placements", "flavor_mismatch"]

Obj = dict[str, Any]


def flavor_mismatch(name: str, flavor: Obj, spec: Obj, label_keys: set[str]) -> str:
    flavor_spec = flavor.get("spec") or {}
    tolerations = (spec.get("tolerations") or []) + (flavor_spec.get("tolerations") or [])
    for taint in flavor_spec.get("nodeTaints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            value = taint.get("value", "")
            shown = f"{taint.get('key')}{'=' + value if value else ''}:{taint.get('effect')}"
            return f"untolerated taint {{{shown}}} in flavor {name}"
    selector = {k: v for k, v in (spec.get("nodeSelector") or {}).items() if k in label_keys}
    restricted: Obj = {"nodeSelector": selector}
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if affinity:
        terms = []
        for term in affinity.get("nodeSelectorTerms") or ():
            expressions = [
                e for e in term.get("matchExpressions") or () if e.get("key") in label_keys
            ]
            terms.append({"matchExpressions": expressions})
        restricted["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    fake_node = {"metadata": {"name": "", "labels": flavor_spec.get("nodeLabels") or {}}}
    if not matches_node(restricted, fake_node):
        return f"flavor {name} doesn't match node affinity"
    return ""


class Placements:
    """Free node capacity for topology-constrained pod sets within one cycle."""

    def __init__(self, items: Callable[[str], list[Obj]]) -> None:
        self.items = items
        self._free: dict[str, Counter[str]] | None = None

    def _capacity(self) -> dict[str, Counter[str]]:
        if self._free is None:
            free: dict[str, Counter[str]] = {}
            for node in self.items("nodes"):
                if not node_ready(node) or (node.get("spec") or {}).get("unschedulable"):
                    continue
                allocatable = (node.get("status") or {}).get("allocatable") or {}
                free[node["metadata"]["name"]] = Counter(
                    pod_requests({"containers": [{"resources": {"requests": allocatable}}]})
                )
            for pod in self.items("pods"):
                node_name = (pod.get("spec") or {}).get("nodeName")
                if node_name in free and (pod.get("status") or {}).get("phase") not in (
                    "Succeeded",
                    "Failed",
                ):
                    free[node_name].subtract(pod_requests(pod["spec"]))
            self._free = free
        return self._free

    def find(
        self, pod_set: Obj, flavor: Obj, per_pod: dict[str, int], count: int
    ) -> tuple[dict[str, str], str]:
        annotations = ((pod_set.get("template") or {}).get("metadata") or {}).get(
            "annotations"
        ) or {}
        level = annotations.get(REQUIRED_TOPOLOGY) or annotations.get(PREFERRED_TOPOLOGY)
        if not level:
            return {}, ""
        required = REQUIRED_TOPOLOGY in annotations
        template_spec = (pod_set.get("template") or {}).get("spec") or {}
        flavor_labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
        domains: dict[str, list[str]] = defaultdict(list)
        for node in self.items("nodes"):
            labels = node["metadata"].get("labels") or {}
            if level not in labels or any(labels.get(k) != v for k, v in flavor_labels.items()):
                continue
            if node["metadata"]["name"] in self._capacity() and matches_node(template_spec, node):
                domains[labels[level]].append(node["metadata"]["name"])
        best: tuple[int, str] | None = None
        for value, nodes in domains.items():
            fits = sum(self._fits(self._capacity()[n], per_pod) for n in nodes)
            if fits >= count and (best is None or fits < best[0]):
                best = (fits, value)
        if best is None:
            if not required:
                return {}, ""
            name = flavor.get("metadata", {}).get("name", "")
            return (
                {},
                f'topology "{level}" doesn\'t allow to fit any of {count} pod(s) in flavor {name}',
            )
        self._reserve(domains[best[1]], per_pod, count)
        return {level: best[1]}, ""

    @staticmethod
    def _fits(free: Counter[str], per_pod: dict[str, int]) -> int:
        counts = [free.get(r, 0) // a for r, a in per_pod.items() if a > 0]
        return max(0, min(counts)) if counts else 10**6

    def _reserve(self, nodes: list[str], per_pod: dict[str, int], count: int) -> None:
        left = count
        for name in nodes:
            free = self._capacity()[name]
            take = min(left, self._fits(free, per_pod))
            for resource, amount in per_pod.items():
                free[resource] -= amount * take
            left -= take
            if left <= 0:
                return
