"""The LeaderWorkerSet controller and pod webhook (kubernetes-sigs/lws,
``pkg/controllers/leaderworkerset_controller.go``, ``pod_controller.go``,
``pkg/webhooks/pod_webhook.go``), through StatefulSets as LWS does it:

* a leader StatefulSet ``<name>`` of ``spec.replicas`` pods ``<name>-<g>`` (Parallel),
  from the leader template (the worker template without one);
* per leader pod, a worker StatefulSet named after it, owned by it, of ``size - 1``
  pods ``<name>-<g>-<i>`` for ``i`` from 1 (Parallel, ``ordinals.start: 1``), created
  with the leader (``startupPolicy: LeaderCreated``) or once it is ready
  (``LeaderReady``), so a group's pods start together;
* ``RecreateGroupOnPodRestart`` (the default): a pod of a group that fails or restarts
  deletes the leader pod, and with it (ownerReferences) the whole group, which the
  leader StatefulSet then recreates;
* status: ``replicas`` (leader pods), ``readyReplicas`` (groups whose leader and
  workers are all ready), ``updatedReplicas``, ``hpaPodSelector``, and ``Available``
  (``AllGroupsReady``) or ``Progressing`` (``GroupsProgressing``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterable
from typing import Any, cast

from sim.kubesim.api import Context, Resource
from sim.kubesim.controllers.apps import live, ordinal, owned, ready, template_hash
from sim.kubesim.controllers.base import Reconciler, owner_reference, set_condition
from sim.kubesim.controllers.jobs import pod_phase
from sim.kubesim.store import Event, clone

__all__ = ["LeaderWorkerSetController"]

Obj = dict[str, Any]
LWS = "leaderworkersets.leaderworkerset.x-k8s.io"
_PREFIX = "leaderworkerset.sigs.k8s.io/"
NAME_LABEL = f"{_PREFIX}name"
GROUP_INDEX_LABEL = f"{_PREFIX}group-index"
GROUP_KEY_LABEL = f"{_PREFIX}group-key"
WORKER_INDEX_LABEL = f"{_PREFIX}worker-index"
REVISION_LABEL = f"{_PREFIX}template-revision-hash"
SIZE_ANNOTATION = f"{_PREFIX}size"
LEADER_ANNOTATION = f"{_PREFIX}leader-name"
REPLICAS_ANNOTATION = f"{_PREFIX}replicas"


def group_key(namespace: str, leader: str) -> str:
    """The label every pod of one group shares (the webhook's hash of the leader)."""
    return hashlib.sha1(f"{namespace}/{leader}".encode()).hexdigest()


def label_pod(operation: str, resource: Resource, obj: Obj, old: Obj | None, ctx: Context) -> None:
    """The LWS pod webhook, on create: a leader gets its group's index and key, every
    pod of a group its worker index (0 for the leader, its ordinal for a worker)."""
    if resource.rtype.key != "pods" or operation != "CREATE":
        return
    metadata = obj.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if NAME_LABEL not in labels:
        return
    name = metadata.get("name", "")
    index = name.rpartition("-")[2]
    if not index.isdigit():
        return
    if labels.get(WORKER_INDEX_LABEL) == "0":  # a leader: its ordinal is its group
        labels.setdefault(GROUP_INDEX_LABEL, index)
        labels.setdefault(GROUP_KEY_LABEL, group_key(metadata.get("namespace", ""), name))
    else:
        labels[WORKER_INDEX_LABEL] = index


class LeaderWorkerSetController(Reconciler):
    name = "lws-controller-manager"
    manager = "lws"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.serve_webhook(label_pod)

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key == LWS:
            yield event.key
        elif resource_key in ("statefulsets.apps", "pods"):
            name = (event.obj["metadata"].get("labels") or {}).get(NAME_LABEL)
            if name:
                yield (event.key[0], name)

    def reconcile(self, key: Hashable) -> None:
        namespace, name = cast(tuple[str, str], key)
        lws = self.get(LWS, namespace, name)
        if lws is None or lws["metadata"].get("deletionTimestamp"):
            return
        spec = lws.get("spec") or {}
        template = spec.get("leaderWorkerTemplate") or {}
        size = int(template.get("size", 1))
        revision = template_hash(template)
        leader_set = self._leader_set(lws, revision)
        leaders = {
            index: pod
            for pod in owned(self, "pods", leader_set)
            if (index := ordinal(name, pod)) is not None and live(pod)
        }
        groups: dict[int, tuple[Obj, Obj | None]] = {}
        for index, leader in sorted(leaders.items()):
            workers = self._workers(lws, leader, size, revision) if size > 1 else None
            if self._restart_group(lws, leader, workers):
                continue
            groups[index] = (leader, workers)
        self._status(lws, leader_set, groups, size)

    # -- the leader StatefulSet ------------------------------------------------------------

    def _leader_set(self, lws: Obj, revision: str) -> Obj:
        spec = lws.get("spec") or {}
        template_spec = spec.get("leaderWorkerTemplate") or {}
        name = lws["metadata"]["name"]
        replicas = int(spec.get("replicas", 1))
        existing = self.get("statefulsets.apps", lws["metadata"]["namespace"], name)
        if existing is not None:
            if int(existing["spec"].get("replicas", 1)) != replicas:
                existing = self.mutate(
                    "statefulsets.apps",
                    existing,
                    lambda s: s["spec"].__setitem__("replicas", replicas),
                )
            return existing
        template = clone(
            template_spec.get("leaderTemplate") or template_spec.get("workerTemplate") or {}
        )
        meta = template.setdefault("metadata", {})
        meta["labels"] = {
            **(meta.get("labels") or {}),
            WORKER_INDEX_LABEL: "0",
            NAME_LABEL: name,
            REVISION_LABEL: revision,
        }
        meta["annotations"] = {
            **(meta.get("annotations") or {}),
            SIZE_ANNOTATION: str(template_spec.get("size", 1)),
        }
        sts: Obj = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": name,
                "namespace": lws["metadata"]["namespace"],
                "labels": {NAME_LABEL: name, REVISION_LABEL: revision},
                "annotations": {REPLICAS_ANNOTATION: str(replicas)},
                "ownerReferences": [owner_reference(lws)],
            },
            "spec": {
                "serviceName": name,
                "replicas": replicas,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {NAME_LABEL: name, WORKER_INDEX_LABEL: "0"}},
                "template": template,
            },
        }
        created = self.create("statefulsets.apps", sts)
        self.events.emit(
            lws, "LeaderWorkerSet", "GroupsProgressing", f"Created leader statefulset {name}"
        )
        return created

    # -- a group's workers -----------------------------------------------------------------

    def _workers(self, lws: Obj, leader: Obj, size: int, revision: str) -> Obj | None:
        """The worker StatefulSet of ``leader``'s group, created when the leader is
        (``LeaderCreated``) or once it is ready (``LeaderReady``)."""
        namespace, leader_name = leader["metadata"]["namespace"], leader["metadata"]["name"]
        existing = self.get("statefulsets.apps", namespace, leader_name)
        if existing is not None:
            return existing
        spec = lws.get("spec") or {}
        if spec.get("startupPolicy") == "LeaderReady" and not ready(leader):
            return None
        labels = leader["metadata"].get("labels") or {}
        name = lws["metadata"]["name"]
        group = {
            NAME_LABEL: name,
            GROUP_INDEX_LABEL: labels.get(GROUP_INDEX_LABEL, ""),
            GROUP_KEY_LABEL: labels.get(GROUP_KEY_LABEL, ""),
        }
        template = clone((spec.get("leaderWorkerTemplate") or {}).get("workerTemplate") or {})
        meta = template.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), **group, REVISION_LABEL: revision}
        meta["annotations"] = {
            **(meta.get("annotations") or {}),
            SIZE_ANNOTATION: str(size),
            LEADER_ANNOTATION: leader_name,
        }
        sts: Obj = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": leader_name,
                "namespace": namespace,
                "labels": {**group, REVISION_LABEL: revision},
                "ownerReferences": [owner_reference(leader)],
            },
            "spec": {
                "serviceName": name,
                "replicas": size - 1,
                "ordinals": {"start": 1},
                "podManagementPolicy": "Parallel",
                "selector": {
                    "matchLabels": {NAME_LABEL: name, GROUP_KEY_LABEL: group[GROUP_KEY_LABEL]}
                },
                "template": template,
            },
        }
        return self.create("statefulsets.apps", sts)

    def _restart_group(self, lws: Obj, leader: Obj, workers: Obj | None) -> bool:
        """``RecreateGroupOnPodRestart``: a failed or restarted pod takes its group down."""
        policy = (lws.get("spec") or {}).get("leaderWorkerTemplate", {}).get("restartPolicy")
        if policy == "None":
            return False
        pods = [leader] + (owned(self, "pods", workers) if workers is not None else [])
        broken = any(
            pod_phase(pod) == "Failed"
            or any(
                s.get("restartCount", 0)
                for s in (pod.get("status") or {}).get("containerStatuses") or ()
            )
            for pod in pods
        )
        if broken:
            self.delete("pods", leader)
            self.events.emit(
                lws,
                "LeaderWorkerSet",
                "RecreateGroupOnPodRestart",
                f"Worker pod of group {leader['metadata']['name']} restarted: recreating the group",
            )
        return broken

    # -- status ----------------------------------------------------------------------------

    def _status(
        self, lws: Obj, leader_set: Obj, groups: dict[int, tuple[Obj, Obj | None]], size: int
    ) -> None:
        name = lws["metadata"]["name"]
        replicas = int((lws.get("spec") or {}).get("replicas", 1))

        def group_ready(leader: Obj, workers: Obj | None) -> bool:
            if not ready(leader):
                return False
            if size == 1:
                return True
            if workers is None:
                return False
            return int((workers.get("status") or {}).get("readyReplicas", 0)) == size - 1

        ready_count = sum(1 for index, group in groups.items() if group_ready(*group))
        in_spec = sum(
            1 for index, group in groups.items() if index < replicas and group_ready(*group)
        )
        status = clone(lws.get("status") or {})
        status.update(
            replicas=int((leader_set.get("status") or {}).get("replicas", 0)),
            readyReplicas=ready_count,
            updatedReplicas=len(groups),
            hpaPodSelector=f"{NAME_LABEL}={name},{WORKER_INDEX_LABEL}=0",
        )
        available = in_spec == replicas
        set_condition(
            status,
            "Available",
            "True" if available else "False",
            "AllGroupsReady",
            "All replicas are ready",
            observed_generation=lws["metadata"].get("generation"),
        )
        set_condition(
            status,
            "Progressing",
            "False" if available else "True",
            "GroupsProgressing",
            "Replicas are progressing",
            observed_generation=lws["metadata"].get("generation"),
        )
        if available and not _was_available(lws):
            self.events.emit(
                lws,
                "LeaderWorkerSet",
                "AllGroupsReady",
                f"All replicas are ready, with {ready_count} groups ready of total "
                f"{replicas} groups",
            )
        self.mutate(LWS, lws, lambda o: o.__setitem__("status", status), status=True)


def _was_available(lws: Obj) -> bool:
    for entry in (lws.get("status") or {}).get("conditions") or ():
        if entry.get("type") == "Available":
            return bool(entry.get("status") == "True")
    return False
