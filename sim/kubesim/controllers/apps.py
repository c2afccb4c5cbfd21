"""apps/v1: the Deployment, ReplicaSet and StatefulSet controllers, after
kube-controller-manager's (``pkg/controller/deployment``, ``replicaset``,
``statefulset``); what they model and leave out: docs/kubesim-serving.md.

A Deployment owns one ReplicaSet per pod template (``<name>-<pod-template-hash>``),
rolled by ``maxSurge`` / ``maxUnavailable`` (or ``Recreate``); a ReplicaSet keeps
``replicas`` live pods named ``<rs>-<random>``; a StatefulSet keeps pods
``<name>-<ordinal>``, created in order and each only once the one before it is
Running and Ready (``OrderedReady``) or all at once (``Parallel``), and removed
from the highest ordinal down.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable, Iterable
from typing import Any, cast

from sim.kubesim.api import now_rfc3339
from sim.kubesim.controllers.base import (
    Reconciler,
    controller_of,
    is_true,
    owner_reference,
    set_condition,
)
from sim.kubesim.controllers.jobs import pod_phase
from sim.kubesim.store import Event, clone

__all__ = [
    "DeploymentController",
    "ReplicaSetController",
    "StatefulSetController",
    "template_hash",
]

Obj = dict[str, Any]
HASH_LABEL = "pod-template-hash"
REVISION_LABEL = "controller-revision-hash"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
_SAFE = "bcdfghjklmnpqrstvwxz2456789"
_TERMINAL = ("Succeeded", "Failed")


def template_hash(template: Obj) -> str:
    """A pod template's hash, in the alphabet ``rand.SafeEncodeString`` uses (no vowels,
    no look-alikes) over the decimal digits of a 32-bit digest, as ``ComputeHash`` does."""
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")
    return "".join(_SAFE[ord(c) % len(_SAFE)] for c in str(digest))


def live(pod: Obj) -> bool:
    """Not ended and not being deleted: what a ReplicaSet or StatefulSet counts."""
    return pod_phase(pod) not in _TERMINAL and not pod["metadata"].get("deletionTimestamp")


def ready(pod: Obj) -> bool:
    return pod_phase(pod) == "Running" and is_true(pod, "Ready")


def owned(controller: Reconciler, key: str, owner: Obj) -> list[Obj]:
    uid = owner["metadata"]["uid"]
    return [
        obj
        for obj in controller.items(key, owner["metadata"]["namespace"])
        if (controller_of(obj) or {}).get("uid") == uid
    ]


def _owner_key(event: Event, kind: str) -> Iterable[Hashable]:
    owner = controller_of(event.obj) or (controller_of(event.prev) if event.prev else None)
    if owner and owner.get("kind") == kind:
        yield (event.key[0], owner.get("name", ""))


def _pod_from(owner: Obj, template: Obj, labels: Obj) -> Obj:
    """A pod of ``template``, controlled by ``owner`` (``GetPodFromTemplate``)."""
    metadata = template.get("metadata") or {}
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": owner["metadata"]["namespace"],
            "labels": {**(metadata.get("labels") or {}), **labels},
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": clone(template.get("spec") or {}),
    }
    if metadata.get("annotations"):
        pod["metadata"]["annotations"] = dict(metadata["annotations"])
    if metadata.get("finalizers"):
        pod["metadata"]["finalizers"] = list(metadata["finalizers"])
    return pod


def _deletion_rank(pod: Obj) -> tuple[int, int, int, str]:
    """Which pods a scale-down removes first (``ActivePods`` order): unscheduled, then
    pending, then not ready, then the newest."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    created = pod["metadata"].get("creationTimestamp", "")
    newest_first = "".join(chr(0x10FFFF - ord(c)) for c in created)
    return (
        0 if not spec.get("nodeName") else 1,
        0 if status.get("phase") == "Pending" else 1,
        1 if ready(pod) else 0,
        newest_first,
    )


class ReplicaSetController(Reconciler):
    """Keeps ``spec.replicas`` live pods of the ReplicaSet's template."""

    name = "replicaset-controller"

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key == "replicasets.apps":
            yield event.key
        elif resource_key == "pods":
            yield from _owner_key(event, "ReplicaSet")

    def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        rs = self.get("replicasets.apps", namespace, name)
        if rs is None or rs["metadata"].get("deletionTimestamp"):
            return
        active = [pod for pod in owned(self, "pods", rs) if live(pod)]
        wanted = int(rs["spec"].get("replicas", 1))
        if len(active) < wanted:
            for _ in range(wanted - len(active)):
                active.append(self._create_pod(rs))
        elif len(active) > wanted:
            doomed = sorted(active, key=_deletion_rank)[: len(active) - wanted]
            for pod in doomed:
                self.delete("pods", pod)
                self.events.emit(
                    rs, "ReplicaSet", "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}"
                )
            active = [pod for pod in active if pod not in doomed]
        ready_count = sum(1 for pod in active if ready(pod))
        status = {
            "replicas": len(active),
            "fullyLabeledReplicas": len(active),
            "readyReplicas": ready_count,
            "availableReplicas": ready_count,
            "observedGeneration": rs["metadata"].get("generation", 1),
        }
        for field in ("fullyLabeledReplicas", "readyReplicas", "availableReplicas"):
            if not status[field]:
                del status[field]
        self.mutate("replicasets.apps", rs, lambda r: r.__setitem__("status", status), status=True)

    def _create_pod(self, rs: Obj) -> Obj:
        pod = _pod_from(rs, rs["spec"].get("template") or {}, {})
        pod["metadata"]["generateName"] = f"{rs['metadata']['name']}-"
        created = self.create("pods", pod)
        self.events.emit(
            rs, "ReplicaSet", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}"
        )
        return created


def _resolve(value: Any, total: int, *, round_up: bool) -> int:
    """An int-or-percent of ``total`` (``intstr.GetScaledValueFromIntOrPercent``)."""
    if isinstance(value, str) and value.endswith("%"):
        share = total * int(value[:-1]) / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(value or 0)


def _revision(rs: Obj) -> int:
    return int((rs["metadata"].get("annotations") or {}).get(REVISION_ANNOTATION, "0") or 0)


class DeploymentController(Reconciler):
    """Rolls a Deployment's ReplicaSets and reports its replicas and conditions."""

    name = "deployment-controller"

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key == "deployments.apps":
            yield event.key
        elif resource_key == "replicasets.apps":
            yield from _owner_key(event, "Deployment")

    def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        deployment = self.get("deployments.apps", namespace, name)
        if deployment is None or deployment["metadata"].get("deletionTimestamp"):
            return
        spec = deployment["spec"]
        sets = owned(self, "replicasets.apps", deployment)
        digest = template_hash(spec.get("template") or {})
        new = next(
            (rs for rs in sets if (rs["metadata"].get("labels") or {}).get(HASH_LABEL) == digest),
            None,
        )
        old = sorted((rs for rs in sets if rs is not new), key=_revision)
        created = False
        if not spec.get("paused"):
            if new is None:
                new = self._create_set(deployment, digest, old)
                created = True
            new, old = self._roll(deployment, new, old)
            self._clean(deployment, old)
        self._status(deployment, new, old, created)

    # -- rollout ---------------------------------------------------------------------------

    def _create_set(self, deployment: Obj, digest: str, old: list[Obj]) -> Obj:
        spec = deployment["spec"]
        template = clone(spec.get("template") or {})
        template.setdefault("metadata", {}).setdefault("labels", {})[HASH_LABEL] = digest
        selector = clone(spec.get("selector") or {})
        selector.setdefault("matchLabels", {})[HASH_LABEL] = digest
        revision = max((_revision(rs) for rs in old), default=0) + 1
        replicas = 0 if old else int(spec.get("replicas", 1))
        rs: Obj = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{deployment['metadata']['name']}-{digest}",
                "namespace": deployment["metadata"]["namespace"],
                "labels": dict(template["metadata"]["labels"]),
                "annotations": {
                    REVISION_ANNOTATION: str(revision),
                    "deployment.kubernetes.io/desired-replicas": str(spec.get("replicas", 1)),
                },
                "ownerReferences": [owner_reference(deployment)],
            },
            "spec": {
                "replicas": replicas,
                "minReadySeconds": int(spec.get("minReadySeconds", 0)),
                "selector": selector,
                "template": template,
            },
        }
        created = self.create("replicasets.apps", rs)
        self._scaled(deployment, created, 0, replicas)
        self.mutate(
            "deployments.apps",
            deployment,
            lambda d: (
                d["metadata"]
                .setdefault("annotations", {})
                .__setitem__(REVISION_ANNOTATION, str(revision))
            ),
        )
        return created

    def _roll(self, deployment: Obj, new: Obj, old: list[Obj]) -> tuple[Obj, list[Obj]]:
        spec = deployment["spec"]
        desired = int(spec.get("replicas", 1))
        strategy = spec.get("strategy") or {}
        if strategy.get("type") == "Recreate":
            if any(int(rs["spec"].get("replicas", 0)) for rs in old):
                return new, [self._scale(deployment, rs, 0) for rs in old]
            if any((rs.get("status") or {}).get("replicas") for rs in old):
                return new, old  # the old pods must be gone before the new ones start
            return self._scale(deployment, new, desired), old
        if not any(int(rs["spec"].get("replicas", 0)) for rs in old):
            return self._scale(deployment, new, desired), old
        rolling = strategy.get("rollingUpdate") or {}
        surge = _resolve(rolling.get("maxSurge", "25%"), desired, round_up=True)
        unavailable = _resolve(rolling.get("maxUnavailable", "25%"), desired, round_up=False)
        if surge == 0 and unavailable == 0:
            unavailable = 1
        sets = [new, *old]
        total = sum(int(rs["spec"].get("replicas", 0)) for rs in sets)
        current = int(new["spec"].get("replicas", 0))
        if total < desired + surge and current < desired:
            new = self._scale(deployment, new, min(desired, current + desired + surge - total))
        available = sum(int((rs.get("status") or {}).get("availableReplicas", 0)) for rs in sets)
        allowed = available - (desired - unavailable)
        kept = []
        for rs in old:  # oldest first
            replicas = int(rs["spec"].get("replicas", 0))
            cut = min(replicas, max(0, allowed))
            allowed -= cut
            kept.append(self._scale(deployment, rs, replicas - cut) if cut else rs)
        return new, kept

    def _scale(self, deployment: Obj, rs: Obj, replicas: int) -> Obj:
        before = int(rs["spec"].get("replicas", 0))
        if before == replicas:
            return rs
        updated = self.mutate(
            "replicasets.apps", rs, lambda r: r["spec"].__setitem__("replicas", replicas)
        )
        self._scaled(deployment, updated, before, replicas)
        return updated

    def _scaled(self, deployment: Obj, rs: Obj, before: int, after: int) -> None:
        if before == after:
            return
        verb = "up" if after > before else "down"
        self.events.emit(
            deployment,
            "Deployment",
            "ScalingReplicaSet",
            f"Scaled {verb} replica set {rs['metadata']['name']} from {before} to {after}",
        )

    def _clean(self, deployment: Obj, old: list[Obj]) -> None:
        """Old ReplicaSets scaled to nothing beyond ``revisionHistoryLimit`` go, oldest first."""
        limit = int(deployment["spec"].get("revisionHistoryLimit", 10))
        idle = [
            rs
            for rs in old
            if not int(rs["spec"].get("replicas", 0))
            and not (rs.get("status") or {}).get("replicas")
        ]
        for rs in idle[: max(0, len(idle) - limit)]:
            self.delete("replicasets.apps", rs)

    # -- status ----------------------------------------------------------------------------

    def _status(self, deployment: Obj, new: Obj | None, old: list[Obj], created: bool) -> None:
        spec = deployment["spec"]
        desired = int(spec.get("replicas", 1))
        sets = [rs for rs in (new, *old) if rs is not None]

        def count(field: str, of: Iterable[Obj] = sets) -> int:
            return sum(int((rs.get("status") or {}).get(field, 0)) for rs in of)

        available = count("availableReplicas")
        total = sum(int(rs["spec"].get("replicas", 0)) for rs in sets)
        status = clone(deployment.get("status") or {})
        status.update(
            observedGeneration=deployment["metadata"].get("generation", 1),
            replicas=count("replicas"),
            updatedReplicas=count("replicas", [new] if new is not None else []),
            readyReplicas=count("readyReplicas"),
            availableReplicas=available,
            unavailableReplicas=max(0, total - available),
        )
        for field in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas"):
            if not status[field]:
                del status[field]
        if not status["unavailableReplicas"]:
            del status["unavailableReplicas"]
        rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        unavailable = _resolve(rolling.get("maxUnavailable", 0), desired, round_up=False)
        if available >= desired - unavailable:
            _deployment_condition(
                status,
                "Available",
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            )
        else:
            _deployment_condition(
                status,
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        if new is not None:
            rs_name = new["metadata"]["name"]
            complete = (
                count("replicas", [new]) == desired
                and count("availableReplicas", [new]) == desired
                and not any(int(rs["spec"].get("replicas", 0)) for rs in old)
                and not count("replicas", old)
            )
            if complete:
                reason, message = (
                    "NewReplicaSetAvailable",
                    f'ReplicaSet "{rs_name}" has successfully progressed.',
                )
            elif created:
                reason, message = "NewReplicaSetCreated", f'Created new replica set "{rs_name}"'
            else:
                reason, message = "ReplicaSetUpdated", f'ReplicaSet "{rs_name}" is progressing.'
            _deployment_condition(status, "Progressing", "True", reason, message)
        self.mutate(
            "deployments.apps",
            deployment,
            lambda d: d.__setitem__("status", status),
            status=True,
        )


def _deployment_condition(status: Obj, type_: str, value: str, reason: str, message: str) -> None:
    """A Deployment condition: ``lastUpdateTime`` moves when its reason or message does."""
    before = next((c for c in status.get("conditions") or () if c.get("type") == type_), None)
    changed = before is None or (before.get("reason"), before.get("message")) != (reason, message)
    set_condition(status, type_, value, reason, message)
    entry = next(c for c in status["conditions"] if c.get("type") == type_)
    if changed or "lastUpdateTime" not in entry:
        entry["lastUpdateTime"] = now_rfc3339()
    status["conditions"] = sorted(
        status["conditions"], key=lambda c: ("Available", "Progressing").index(c["type"])
    )


# -- StatefulSet ---------------------------------------------------------------------------


def ordinal(name: str, pod: Obj) -> int | None:
    """The ordinal of a StatefulSet's pod ``<name>-<ordinal>``."""
    prefix, _, tail = pod["metadata"]["name"].rpartition("-")
    return int(tail) if prefix == name and tail.isdigit() else None


class StatefulSetController(Reconciler):
    """Pods ``<name>-<i>`` for ``i`` from ``spec.ordinals.start``, in order."""

    name = "statefulset-controller"

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key == "statefulsets.apps":
            yield event.key
        elif resource_key == "pods":
            yield from _owner_key(event, "StatefulSet")

    def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        sts = self.get("statefulsets.apps", namespace, name)
        if sts is None or sts["metadata"].get("deletionTimestamp"):
            return
        spec = sts["spec"]
        revision = f"{name}-{template_hash(spec.get('template') or {})}"
        pods = {
            index: pod
            for pod in owned(self, "pods", sts)
            if (index := ordinal(name, pod)) is not None
        }
        start = int((spec.get("ordinals") or {}).get("start", 0))
        wanted = range(start, start + int(spec.get("replicas", 1)))
        ordered = spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
        for pod in pods.values():
            if pod_phase(pod) in _TERMINAL and not pod["metadata"].get("deletionTimestamp"):
                self.delete("pods", pod)  # a pod that ended is replaced, as the controller does
        if self._create(sts, pods, wanted, revision, ordered):
            self._condemn(sts, pods, wanted, ordered)
        self._status(sts, revision)

    def _create(
        self, sts: Obj, pods: dict[int, Obj], wanted: range, revision: str, ordered: bool
    ) -> bool:
        """Create the missing ordinals; ``True`` once every wanted pod is Running and Ready
        (what OrderedReady waits for before it removes any)."""
        settled = True
        for index in wanted:
            pod = pods.get(index)
            if pod is None:
                self._create_pod(sts, index, revision)
                settled = False
                if ordered:
                    return False
            elif not live(pod) or not ready(pod):
                settled = False
                if ordered:
                    return False
        return settled or not ordered

    def _condemn(self, sts: Obj, pods: dict[int, Obj], wanted: range, ordered: bool) -> None:
        """Ordinals past ``replicas`` go, highest first; OrderedReady one at a time."""
        extra = sorted((i for i in pods if i not in wanted), reverse=True)
        for index in extra:
            pod = pods[index]
            if pod["metadata"].get("deletionTimestamp"):
                if ordered:
                    return
                continue
            self.delete("pods", pod)
            self.events.emit(
                sts,
                "StatefulSet",
                "SuccessfulDelete",
                f"delete Pod {pod['metadata']['name']} in StatefulSet "
                f"{sts['metadata']['name']} successful",
            )
            if ordered:
                return

    def _create_pod(self, sts: Obj, index: int, revision: str) -> None:
        name = f"{sts['metadata']['name']}-{index}"
        labels = {
            REVISION_LABEL: revision,
            POD_NAME_LABEL: name,
            POD_INDEX_LABEL: str(index),
        }
        pod = _pod_from(sts, sts["spec"].get("template") or {}, labels)
        pod["metadata"]["name"] = name
        pod["spec"]["hostname"] = name
        if sts["spec"].get("serviceName"):
            pod["spec"]["subdomain"] = sts["spec"]["serviceName"]
        self.create("pods", pod)
        self.events.emit(
            sts,
            "StatefulSet",
            "SuccessfulCreate",
            f"create Pod {name} in StatefulSet {sts['metadata']['name']} successful",
        )

    def _status(self, sts: Obj, revision: str) -> None:
        pods = [pod for pod in owned(self, "pods", sts) if live(pod)]
        ready_count = sum(1 for pod in pods if ready(pod))
        updated = sum(
            1
            for pod in pods
            if (pod["metadata"].get("labels") or {}).get(REVISION_LABEL) == revision
        )
        status: Obj = {
            "observedGeneration": sts["metadata"].get("generation", 1),
            "replicas": len(pods),
            "readyReplicas": ready_count,
            "availableReplicas": ready_count,
            "currentReplicas": updated,
            "updatedReplicas": updated,
            "currentRevision": revision,
            "updateRevision": revision,
            "collisionCount": 0,
        }
        for field in ("readyReplicas", "currentReplicas", "updatedReplicas"):
            if not status[field]:
                del status[field]
        self.mutate(
            "statefulsets.apps", sts, lambda s: s.__setitem__("status", status), status=True
        )
