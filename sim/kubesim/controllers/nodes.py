"""The node side of the cluster: a scheduler that binds pods and a kubelet that runs them.

The scheduler binds a pending pod to a Ready, schedulable node whose labels
satisfy the pod's ``nodeSelector`` and required node affinity, whose taints the
pod tolerates and whose allocatable resources still fit the pod's requests —
packing GPUs (the fullest feasible node wins) — or records ``PodScheduled=False``
with the scheduler's ``0/N nodes are available: …`` message. The kubelet
starts bound pods, runs each for its ``quartermaster.dev/sim-duration``
(looked up on the pod, then up its owner chain; scaled by the cluster's
``time_scale``) and ends it with ``quartermaster.dev/sim-exit`` (default 0).
Faults: a node going NotReady gets the ``unreachable`` taints and, after the
pods' toleration (300 s scaled), its pods are evicted; a pod can be failed on
demand.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable
from typing import Any, cast

from sim.kubesim.api import now_rfc3339
from sim.kubesim.controllers.base import (
    Reconciler,
    controller_of,
    parse_duration,
    pod_requests,
    set_condition,
)
from sim.kubesim.controllers.intervals import RunningIntervals
from sim.kubesim.seed import ready_condition
from sim.kubesim.store import DELETED, Event

__all__ = ["DURATION_ANNOTATION", "EXIT_ANNOTATION", "Kubelet", "Scheduler"]

Obj = dict[str, Any]
DURATION_ANNOTATION = "quartermaster.dev/sim-duration"
EXIT_ANNOTATION = "quartermaster.dev/sim-exit"
UNREACHABLE = "node.kubernetes.io/unreachable"
_TERMINAL = ("Succeeded", "Failed")
_DEFAULT_TOLERATION_SECONDS = 300.0


def _bound_and_live(pod: Obj) -> bool:
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
        if node and _bound_and_live(pod) and not deleted:
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
            _strip_empty_reasons(status)

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


class Kubelet(Reconciler):
    """Every node's kubelet at once: starts, runs, ends and evicts pods."""

    name = "kubelet"
    manager = "kubelet"
    watches = ("pods",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.running: set[str] = set()
        self.intervals = RunningIntervals()
        self.store.listeners.append(self.intervals.observe)

    def running_intervals(self) -> list[Obj]:
        """Every pod's running intervals so far (``/_admin/intervals``)."""
        return self.intervals.snapshot()

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if (
            resource_key == "pods"
            and event.type != DELETED
            and (event.obj.get("spec") or {}).get("nodeName")
        ):
            yield ("pod", *event.key)
        elif resource_key == "nodes" and event.type != DELETED:
            yield ("node", event.key[1])

    def reconcile(self, key: Hashable) -> None:
        kind, *rest = cast(tuple[str, ...], key)
        if kind == "pod":
            self._reconcile_pod(*rest)
        elif kind == "node":
            self._reconcile_node(rest[0])
        elif kind == "finish":
            self._finish(*rest)
        elif kind == "evict":
            self._evict(*rest)

    # -- pods ------------------------------------------------------------------------------

    def _reconcile_pod(self, namespace: str, name: str) -> None:
        pod = self.get("pods", namespace, name)
        if pod is None:
            return
        phase = (pod.get("status") or {}).get("phase")
        node = self.get("nodes", "", pod["spec"]["nodeName"])
        if pod["metadata"].get("deletionTimestamp"):
            if phase not in _TERMINAL and (node is None or node_ready(node) or self._evicted(pod)):
                self._terminate(pod, 143, "Error", "terminated on deletion")
            return
        if phase == "Pending" and node is not None and node_ready(node):
            self._start(pod)

    def _evicted(self, pod: Obj) -> bool:
        return any(
            c.get("type") == "DisruptionTarget"
            for c in (pod.get("status") or {}).get("conditions") or ()
        )

    def _start(self, pod: Obj) -> None:
        now = now_rfc3339()
        node = self.get("nodes", "", pod["spec"]["nodeName"]) or {}
        addresses = (node.get("status") or {}).get("addresses") or []
        host_ip = next(
            (a["address"] for a in addresses if a.get("type") == "InternalIP"), "10.0.0.1"
        )

        def running(p: Obj) -> None:
            status = p.setdefault("status", {})
            status.update(phase="Running", startTime=now, hostIP=host_ip, podIP=_pod_ip(p))
            status["hostIPs"] = [{"ip": host_ip}]
            status["podIPs"] = [{"ip": status["podIP"]}]
            for type_ in (
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled",
            ):
                set_condition(status, type_, "True", "", "", probe_times=True)
            _strip_empty_reasons(status)
            status["containerStatuses"] = [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": f"{c.get('image', '')}@sha256:{'0' * 64}",
                    "containerID": _container_id(p, c),
                    "ready": True,
                    "started": True,
                    "restartCount": _restarts(p, c["name"]),
                    "state": {"running": {"startedAt": now}},
                }
                for c in p["spec"].get("containers") or ()
            ]

        started = self.mutate("pods", pod, running, status=True)
        duration = self._duration(started)
        if duration is not None:
            key = (
                "finish",
                pod["metadata"].get("namespace", ""),
                pod["metadata"]["name"],
                pod["metadata"]["uid"],
            )
            self.enqueue_after(key, self.scaled(duration))

    def _duration(self, pod: Obj) -> float | None:
        annotations, exit_code = self._sim_annotations(pod)
        del exit_code
        return parse_duration(annotations)

    def _sim_annotations(self, pod: Obj) -> tuple[str | None, int]:
        """The sim annotations of the pod, or of the nearest owner up the chain that has them."""
        obj: Obj | None = pod
        for _ in range(4):
            if obj is None:
                break
            annotations = obj["metadata"].get("annotations") or {}
            if DURATION_ANNOTATION in annotations or EXIT_ANNOTATION in annotations:
                try:
                    exit_code = int(annotations.get(EXIT_ANNOTATION, 0))
                except ValueError:
                    exit_code = 1
                return annotations.get(DURATION_ANNOTATION), exit_code
            obj = self._owner(obj)
        return None, 0

    def _owner(self, obj: Obj) -> Obj | None:
        ref = controller_of(obj)
        if ref is None:
            return None
        api_version, kind = ref.get("apiVersion", ""), ref.get("kind", "")
        try:
            resource = self.core.for_kind(api_version, kind)
        except Exception:
            return None
        owner = self.store.get(
            resource.rtype, obj["metadata"].get("namespace", ""), ref.get("name", "")
        )
        return owner if owner is not None and owner["metadata"]["uid"] == ref.get("uid") else None

    def _finish(self, namespace: str, name: str, uid: str) -> None:
        pod = self.get("pods", namespace, name)
        if (
            pod is None
            or pod["metadata"]["uid"] != uid
            or (pod.get("status") or {}).get("phase") != "Running"
        ):
            return
        _, exit_code = self._sim_annotations(pod)
        if exit_code == 0:
            self._terminate(pod, 0, "Completed", "")
        else:
            self.fail_running(pod, exit_code, "Error", "")

    def fail_running(self, pod: Obj, exit_code: int, reason: str, message: str) -> Obj:
        restart = pod["spec"].get("restartPolicy", "Always")
        if restart == "Never" or pod["metadata"].get("deletionTimestamp"):
            return self._terminate(pod, exit_code, reason, message)

        def restarted(p: Obj) -> None:
            for status in p["status"].get("containerStatuses") or ():
                status["restartCount"] = status.get("restartCount", 0) + 1
                status["lastState"] = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "finishedAt": now_rfc3339(),
                    }
                }

        updated = self.mutate("pods", pod, restarted, status=True)
        duration = self._duration(updated)
        if duration is not None:
            key = (
                "finish",
                updated["metadata"].get("namespace", ""),
                updated["metadata"]["name"],
                updated["metadata"]["uid"],
            )
            self.enqueue_after(key, self.scaled(duration))
        return updated

    def _terminate(self, pod: Obj, exit_code: int, reason: str, message: str) -> Obj:
        now = now_rfc3339()
        phase = "Succeeded" if exit_code == 0 else "Failed"

        def terminated(p: Obj) -> None:
            status = p.setdefault("status", {})
            status["phase"] = phase
            for type_ in ("Ready", "ContainersReady"):
                set_condition(
                    status,
                    type_,
                    "False",
                    "PodCompleted" if phase == "Succeeded" else "PodFailed",
                    "",
                    probe_times=True,
                )
            for container in status.get("containerStatuses") or ():
                started = (container.get("state") or {}).get("running", {}).get("startedAt", now)
                container.update(ready=False, started=False)
                container["state"] = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "startedAt": started,
                        "finishedAt": now,
                        "containerID": container.get("containerID", ""),
                        **({"message": message} if message else {}),
                    }
                }

        return self.mutate("pods", pod, terminated, status=True)

    # -- nodes -----------------------------------------------------------------------------

    def _reconcile_node(self, name: str) -> None:
        node = self.get("nodes", "", name)
        if node is None or not node_ready(node):
            return
        for pod in self.items("pods"):
            if (
                pod["spec"].get("nodeName") == name
                and (pod.get("status") or {}).get("phase") == "Pending"
            ):
                self.enqueue(("pod", pod["metadata"].get("namespace", ""), pod["metadata"]["name"]))

    def node_readiness_changed(self, node: Obj, ready: bool) -> Obj:
        """Fault injection: the node's kubelet stops (or resumes) posting status."""
        now = now_rfc3339()

        def taints(n: Obj) -> None:
            spec = n.setdefault("spec", {})
            kept = [t for t in spec.get("taints") or () if t.get("key") != UNREACHABLE]
            if not ready:
                kept += [
                    {"key": UNREACHABLE, "effect": "NoSchedule", "timeAdded": now},
                    {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": now},
                ]
            if kept:
                spec["taints"] = kept
            else:
                spec.pop("taints", None)

        def status(n: Obj) -> None:
            conditions = [
                c for c in n["status"].get("conditions") or () if c.get("type") != "Ready"
            ]
            n["status"]["conditions"] = [*conditions, ready_condition(ready, now)]

        updated = self.mutate("nodes", node, taints)
        updated = self.mutate("nodes", updated, status, status=True)
        if not ready:
            for pod in self.items("pods"):
                if pod["spec"].get("nodeName") == node["metadata"]["name"] and _bound_and_live(pod):
                    seconds = _toleration_seconds(pod)
                    if seconds == float("inf"):
                        continue
                    key = (
                        "evict",
                        pod["metadata"].get("namespace", ""),
                        pod["metadata"]["name"],
                        pod["metadata"]["uid"],
                    )
                    self.enqueue_after(key, self.scaled(seconds))
        return updated

    def _evict(self, namespace: str, name: str, uid: str) -> None:
        pod = self.get("pods", namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid or not _bound_and_live(pod):
            return
        node = self.get("nodes", "", pod["spec"]["nodeName"])
        if node is not None and node_ready(node):
            return

        def disrupted(p: Obj) -> None:
            set_condition(
                p.setdefault("status", {}),
                "DisruptionTarget",
                "True",
                "DeletionByTaintManager",
                "Taint manager: deleting due to NoExecute taint",
                probe_times=True,
            )

        marked = self.mutate("pods", pod, disrupted, status=True)
        # The node's kubelet is gone: pod GC marks the pod failed so that its owner can count it.
        failed = self._terminate(marked, 137, "Error", "node lost")
        self.delete("pods", failed)

    def fail_pod(self, namespace: str, name: str, exit_code: int, reason: str, message: str) -> Obj:
        pod = self.get("pods", namespace, name)
        if pod is None:
            from sim.kubesim import errors

            raise errors.not_found("pods", "", name)
        if (pod.get("status") or {}).get("phase") == "Running":
            return self.fail_running(pod, exit_code, reason, message)
        return self._terminate(pod, exit_code, reason, message)


def _container_id(pod: Obj, container: Obj) -> str:
    digest = hashlib.sha1((pod["metadata"]["uid"] + container["name"]).encode()).hexdigest()
    return f"containerd://{digest}"


def _strip_empty_reasons(status: Obj) -> None:
    for entry in status.get("conditions") or ():
        if entry.get("reason") == "":
            entry.pop("reason")
        if entry.get("message") == "":
            entry.pop("message")


def _toleration_seconds(pod: Obj) -> float:
    for toleration in pod["spec"].get("tolerations") or ():
        if toleration.get("key") == UNREACHABLE and toleration.get("effect") == "NoExecute":
            seconds = toleration.get("tolerationSeconds")
            return float(seconds) if seconds is not None else float("inf")
    return _DEFAULT_TOLERATION_SECONDS


def _restarts(pod: Obj, container: str) -> int:
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        if status.get("name") == container:
            return int(status.get("restartCount", 0))
    return 0


def _pod_ip(pod: Obj) -> str:
    digest = hashlib.sha256(pod["metadata"]["uid"].encode()).digest()
    return f"10.244.{digest[0]}.{max(2, digest[1])}"
