"""The scheduler of the stand-in cluster: ``default-scheduler``, binding pods to nodes.

It binds a pending pod to a Ready, schedulable node whose labels satisfy the
pod's ``nodeSelector`` and required node affinity, whose taints the pod
tolerates and whose allocatable resources still fit the pod's requests —
packing GPUs (the fullest feasible node wins) — or records
``PodScheduled=False`` with the scheduler's ``0/N nodes are available: …``
message. Terminal pods hold nothing, as on a real node.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable
from typing import Any, cast

from sim.kubesim.controllers.base import Reconciler, pod_requests, set_condition
from sim.kubesim.store import DELETED, Event

__all__ = ["Scheduler", "bound_and_live", "matches_node", "node_ready", "tolerates"]

Obj = dict[str, Any]
_TERMINAL = ("Succeeded", "Failed")


def bound_and_live(pod: Obj) -> bool:
    return (
        bool((pod.get("spec") or {}).get("nodeName"))
        and (pod.get("status") or {}).get("phase") not in _TERMINAL
    )


def node_ready(node: Obj) -> bool:
    for entry in (node.get("status") or {}).get("conditions") or ():
        if entry.get("type") == "Ready":
            return bool(entry.get("status") == "True")
    return False


def tolerates(tolerations: Iterable[Obj], taint: Obj) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        if toleration.get("operator", "Equal") == "Exists":
            if not toleration.get("key") or toleration.get("key") == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get(
            "value", ""
        ):
            return True
    return False


def _expression_matches(expression: Obj, labels: dict[str, str]) -> bool:
    key, operator = expression.get("key", ""), expression.get("operator")
    values = expression.get("values") or []
    present, value = key in labels, labels.get(key)
    match operator:
        case "In":
            return present and value in values
        case "NotIn":
            return not present or value not in values
        case "Exists":
            return present
        case "DoesNotExist":
            return not present
        case "Gt" | "Lt":
            try:
                left, right = int(value or ""), int(values[0])
            except (ValueError, IndexError):
                return False
            return left > right if operator == "Gt" else left < right
    return False


def _term_matches(term: Obj, node: Obj) -> bool:
    labels = node["metadata"].get("labels") or {}
    for expression in term.get("matchExpressions") or ():
        if not _expression_matches(expression, labels):
            return False
    fields = {"metadata.name": node["metadata"]["name"]}
    return all(
        _expression_matches(expression, fields) for expression in term.get("matchFields") or ()
    )


def matches_node(spec: Obj, node: Obj) -> bool:
    """``nodeSelector`` and required node affinity (terms ORed, expressions ANDed)."""
    labels = node["metadata"].get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if affinity:
        terms = affinity.get("nodeSelectorTerms") or []
        return any(_term_matches(term, node) for term in terms)
    return True


class Scheduler(Reconciler):
    """``default-scheduler``: binds pods to nodes."""

    name = "default-scheduler"
    manager = "kube-scheduler"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.usage: dict[str, dict[tuple[str, str], dict[str, int]]] = defaultdict(dict)
        self.waiting: set[tuple[str, str]] = set()
        for pod in self.items("pods"):
            self._account(pod)

    def _account(self, pod: Obj, *, deleted: bool = False) -> bool:
        """Track per-node requests; True when capacity was freed."""
        key = (pod["metadata"].get("namespace", ""), pod["metadata"]["name"])
        node = (pod.get("spec") or {}).get("nodeName")
        if node and bound_and_live(pod) and not deleted:
            self.usage[node][key] = pod_requests(pod["spec"])
            return False
        freed = False
        for pods in self.usage.values():
            freed = pods.pop(key, None) is not None or freed
        return freed

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key == "pods":
            freed = self._account(event.obj, deleted=event.type == DELETED)
            spec = event.obj.get("spec") or {}
            if (
                event.type != DELETED
                and not spec.get("nodeName")
                and spec.get("schedulerName", "default-scheduler") == "default-scheduler"
            ):
                yield event.key
            elif event.type == DELETED:
                self.waiting.discard(event.key)
            if freed:
                yield from list(self.waiting)
        elif resource_key == "nodes":
            yield from list(self.waiting)

    def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        pod = self.get("pods", namespace, name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            self.waiting.discard((namespace, name))
            return
        spec = pod.get("spec") or {}
        if spec.get("nodeName") or (pod.get("status") or {}).get("phase") != "Pending":
            self.waiting.discard((namespace, name))
            return
        if spec.get("schedulingGates"):
            self._set_unscheduled(
                pod, "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates"
            )
            return
        node, reasons, total = self._choose(pod)
        if node is None:
            self.waiting.add((namespace, name))
            self._unschedulable(pod, reasons, total)
            return
        self.waiting.discard((namespace, name))
        self._bind(pod, node)

    def _choose(self, pod: Obj) -> tuple[str | None, Counter[str], int]:
        spec = pod["spec"]
        requests = pod_requests(spec)
        tolerations = spec.get("tolerations") or []
        reasons: Counter[str] = Counter()
        best: tuple[Any, ...] | None = None
        nodes = self.items("nodes")
        for node in nodes:
            failure = self._filter(node, spec, requests, tolerations)
            if failure:
                reasons.update(failure)
                continue
            free_gpus = self._free(node).get("nvidia.com/gpu", 0) - requests.get(
                "nvidia.com/gpu", 0
            )
            score = (free_gpus, node["metadata"]["name"])
            if best is None or score < best:
                best = score
        return (best[1] if best else None), reasons, len(nodes)

    def _free(self, node: Obj) -> dict[str, int]:
        allocatable = pod_requests(
            {
                "containers": [
                    {"resources": {"requests": (node.get("status") or {}).get("allocatable") or {}}}
                ]
            }
        )
        used: Counter[str] = Counter()
        for requests in self.usage.get(node["metadata"]["name"], {}).values():
            used.update(requests)
        free = {name: amount - used.get(name, 0) for name, amount in allocatable.items()}
        free["pods"] = free.get("pods", 110) - len(self.usage.get(node["metadata"]["name"], {}))
        return free

    def _filter(
        self, node: Obj, spec: Obj, requests: dict[str, int], tolerations: list[Obj]
    ) -> list[str]:
        if (node.get("spec") or {}).get("unschedulable"):
            return ["node(s) were unschedulable"]
        for taint in (node.get("spec") or {}).get("taints") or ():
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
                tolerations, taint
            ):
                shown = f"{taint.get('key')}: {taint.get('value', '')}"
                return [f"node(s) had untolerated taint {{{shown}}}"]
        if not node_ready(node):
            return ["node(s) were not ready"]
        if not matches_node(spec, node):
            return ["node(s) didn't match Pod's node affinity/selector"]
        free = self._free(node)
        missing = [
            name for name, amount in requests.items() if amount > 0 and amount > free.get(name, 0)
        ]
        if free.get("pods", 0) < 1:
            missing.append("pods")
        return [
            ("Too many pods" if name == "pods" else f"Insufficient {name}")
            for name in sorted(missing)
        ]

    def _bind(self, pod: Obj, node: str) -> None:
        bound = self.mutate("pods", pod, lambda p: p["spec"].__setitem__("nodeName", node))

        def scheduled(p: Obj) -> None:
            status = p.setdefault("status", {})
            set_condition(status, "PodScheduled", "True", "", "", probe_times=True)
            strip_empty_reasons(status)

        self.mutate("pods", bound, scheduled, status=True)
        self.events.emit(
            bound,
            "Pod",
            "Scheduled",
            f"Successfully assigned {pod['metadata'].get('namespace')}/"
            f"{pod['metadata']['name']} to {node}",
        )

    def _unschedulable(self, pod: Obj, reasons: Counter[str], total: int) -> None:
        parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
        message = (
            f"0/{total} nodes are available: {', '.join(parts)}. preemption: 0/{total} nodes are "
            f"available: {total} Preemption is not helpful for scheduling."
        )
        self._set_unscheduled(pod, "Unschedulable", message)

    def _set_unscheduled(self, pod: Obj, reason: str, message: str) -> None:
        current = next(
            (
                c
                for c in (pod.get("status") or {}).get("conditions") or ()
                if c.get("type") == "PodScheduled"
            ),
            None,
        )
        if current and current.get("reason") == reason and current.get("message") == message:
            return
        self.mutate(
            "pods",
            pod,
            lambda p: set_condition(
                p.setdefault("status", {}),
                "PodScheduled",
                "False",
                reason,
                message,
                probe_times=True,
            ),
            status=True,
        )
        if reason == "Unschedulable":
            self.events.emit(pod, "Pod", "FailedScheduling", message, "Warning")


def strip_empty_reasons(status: Obj) -> None:
    for entry in status.get("conditions") or ():
        if entry.get("reason") == "":
            entry.pop("reason")
        if entry.get("message") == "":
            entry.pop("message")
