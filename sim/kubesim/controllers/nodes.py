"""The node side of the cluster: every node's kubelet, which runs the pods the
scheduler (sim/kubesim/controllers/scheduler.py) bound.

The kubelet starts bound pods, runs each for its
``quartermaster.dev/sim-duration`` (looked up on the pod, then up its owner
chain; scaled by the cluster's ``time_scale``) and ends it with
``quartermaster.dev/sim-exit`` (default 0). Each start and end is stamped
once: the pod's ``startTime`` / ``startedAt`` / ``finishedAt`` are that
instant truncated to the second (as a real kubelet's), and the running
intervals record (``/_admin/intervals``) keeps the same instant. Faults: a
node going NotReady gets the ``unreachable`` taints and, after the pods'
toleration (300 s scaled), its pods are evicted; a pod can be failed on
demand.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterable
from typing import Any, cast

from sim.kubesim.api import now_rfc3339
from sim.kubesim.controllers.base import Reconciler, controller_of, parse_duration, set_condition
from sim.kubesim.controllers.intervals import RunningIntervals, second
from sim.kubesim.controllers.scheduler import (
    Scheduler,
    bound_and_live,
    matches_node,
    node_ready,
    strip_empty_reasons,
    tolerates,
)
from sim.kubesim.seed import ready_condition
from sim.kubesim.store import DELETED, Event

__all__ = [
    "DURATION_ANNOTATION",
    "EXIT_ANNOTATION",
    "Kubelet",
    "Scheduler",
    "matches_node",
    "node_ready",
    "tolerates",
]

Obj = dict[str, Any]
DURATION_ANNOTATION = "quartermaster.dev/sim-duration"
EXIT_ANNOTATION = "quartermaster.dev/sim-exit"
UNREACHABLE = "node.kubernetes.io/unreachable"
_TERMINAL = ("Succeeded", "Failed")
_DEFAULT_TOLERATION_SECONDS = 300.0


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
        instant = self.intervals.clock()
        now = second(instant)
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
            strip_empty_reasons(status)
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

        with self.intervals.stamped(pod["metadata"]["uid"], instant):
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
        instant = self.intervals.clock()
        now = second(instant)
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

        with self.intervals.stamped(pod["metadata"]["uid"], instant):
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
                if pod["spec"].get("nodeName") == node["metadata"]["name"] and bound_and_live(pod):
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
        if pod is None or pod["metadata"]["uid"] != uid or not bound_and_live(pod):
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
