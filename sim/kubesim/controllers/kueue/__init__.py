"""A Kueue-like controller: jobs become Workloads, Workloads are admitted against
ClusterQueue quota and flavors, admitted jobs are unsuspended and pinned to their
flavors' nodes, and their state flows back into Workload conditions.

It reproduces what Kueue (``pkg/controller/jobframework``, ``pkg/scheduler``,
``flavorassigner``) does in the cases Quartermaster exercises on a member
cluster — and no more:

* a job labelled ``kueue.x-k8s.io/queue-name`` is suspended on create (the
  webhook) and gets a Workload ``<kind>-<name>-<hash>`` owning its pod sets;
* each cycle, pending Workloads are taken by priority then age; each pod set
  gets, per resource group, the first flavor whose labels and taints suit it
  and whose quota (nominal, plus what the cohort lends within
  ``borrowingLimit``) fits; ``StrictFIFO`` queues stop at the first that does
  not fit; a pod set whose template asks
  ``kueue.x-k8s.io/podset-required-topology`` also needs one domain of that
  topology level with room for all its pods;
* admission writes ``status.admission`` and ``QuotaReserved``/``Admitted``;
  failing to fit writes ``QuotaReserved=False`` with Kueue's reason text;
* an admitted job gets the flavors' node labels and tolerations and runs;
  ``PodsReady`` and ``Finished`` follow the job; a finished Workload frees its
  quota; ``spec.active=false`` and ``stopPolicy: HoldAndDrain`` evict.

Not simulated: preemption, admission checks, fair sharing and Cohort-level
quotas (the central service decides those; member queues only mirror it).

Its parts follow Kueue's packages: :mod:`.jobframework` (jobs and their Workloads),
:mod:`.eviction` (the Workload controller), :mod:`.queues` (queue statuses),
:mod:`.admission` with :mod:`.quota` and :mod:`.flavorassigner` (the scheduler),
and :mod:`.workload` (what a Workload is).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from sim.kubesim.controllers.base import controller_of
from sim.kubesim.controllers.kueue.admission import AdmissionCycle
from sim.kubesim.controllers.kueue.eviction import WorkloadEviction
from sim.kubesim.controllers.kueue.jobframework import JOB_KINDS, JobReconciler, suspend_queued_jobs
from sim.kubesim.controllers.kueue.workload import (
    CLUSTER_QUEUES,
    FLAVORS,
    LOCAL_QUEUES,
    QUEUE_LABEL,
    WORKLOADS,
)
from sim.kubesim.store import DELETED, Event

__all__ = ["JOB_KINDS", "QUEUE_LABEL", "KueueController", "suspend_queued_jobs"]

Obj = dict[str, Any]
_CYCLE = ("cycle",)
_QUEUE_OBJECTS = (
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    FLAVORS,
    "cohorts.kueue.x-k8s.io",
    "workloadpriorityclasses.kueue.x-k8s.io",
    "namespaces",
    "nodes",
)


class KueueController(JobReconciler, WorkloadEviction, AdmissionCycle):
    """The whole controller: routes store events to its parts' reconciles."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.workload_of: dict[str, tuple[str, str]] = {}
        self.topology: dict[str, dict[str, dict[str, str]]] = {}
        self.serve_webhook(suspend_queued_jobs)
        for workload in self.items(WORKLOADS):
            self._index(workload)
        self.enqueue(_CYCLE)

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key in JOB_KINDS:
            yield ("job", resource_key, *event.key)
            owner = controller_of(event.obj)
            if owner and owner.get("kind") == "RayJob":  # a RayJob's cluster: its PodsReady
                yield ("job", "rayjobs.ray.io", event.key[0], owner.get("name", ""))
        elif resource_key == WORKLOADS:
            self._index(event.obj, deleted=event.type == DELETED)
            yield ("workload", *event.key)
            owner = controller_of(event.obj)
            if owner is not None:
                for kind in JOB_KINDS.values():
                    if kind.kind == owner.get("kind"):
                        yield ("job", kind.key, event.key[0], owner.get("name", ""))
            yield _CYCLE
        elif resource_key == "pods":
            owner = controller_of(event.obj)
            if owner and owner.get("kind") in ("PyTorchJob", "MPIJob"):
                key = (
                    "pytorchjobs.kubeflow.org"
                    if owner["kind"] == "PyTorchJob"
                    else "mpijobs.kubeflow.org"
                )
                yield ("job", key, event.key[0], owner.get("name", ""))
        elif resource_key in _QUEUE_OBJECTS:
            if resource_key in (CLUSTER_QUEUES, FLAVORS) and event.type != DELETED:
                yield ("finalizer", resource_key, *event.key)
            yield _CYCLE

    def reconcile(self, key: Hashable) -> None:
        kind = key[0]  # type: ignore[index]
        if kind == "job":
            self._reconcile_job(*key[1:])  # type: ignore[index]
        elif kind == "workload":
            self._reconcile_workload(*key[1:])  # type: ignore[index]
        elif kind == "cycle":
            self._cycle()
        elif kind == "finalizer":
            self._ensure_finalizer(*key[1:])  # type: ignore[index]
