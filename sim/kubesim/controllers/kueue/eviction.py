"""The Workload controller's part: a deleted or orphaned Workload lets go of its job, and
an admitted one is evicted when deactivated or when its ClusterQueue drains."""

from __future__ import annotations

from typing import Any

from sim.kubesim.controllers.base import condition, controller_of, is_true, set_condition
from sim.kubesim.controllers.kueue.jobframework import JOB_KINDS
from sim.kubesim.controllers.kueue.reconciler import KueueReconciler
from sim.kubesim.controllers.kueue.workload import CLUSTER_QUEUES, RESOURCE_IN_USE, WORKLOADS

__all__ = ["WorkloadEviction"]

Obj = dict[str, Any]


class WorkloadEviction(KueueReconciler):
    """Workloads being deleted, orphaned, deactivated or drained from their queue."""

    def _reconcile_workload(self, namespace: str, name: str) -> None:
        workload = self.get(WORKLOADS, namespace, name)
        if workload is None:
            return
        if workload["metadata"].get("deletionTimestamp"):
            if RESOURCE_IN_USE in (workload["metadata"].get("finalizers") or ()):
                self._drop_finalizer(workload)
            return
        owner = controller_of(workload)
        if owner is not None and self._owner_gone(workload, owner):
            self._drop_finalizer(workload)
            self.delete(WORKLOADS, self.get(WORKLOADS, namespace, name) or workload)
            return
        if is_true(workload, "QuotaReserved") and not is_true(workload, "Finished"):
            self._maybe_evict(workload)

    def _owner_gone(self, workload: Obj, owner: Obj) -> bool:
        for kind in JOB_KINDS.values():
            if kind.kind == owner.get("kind"):
                job = self.get(kind.key, workload["metadata"]["namespace"], owner.get("name", ""))
                return job is None or job["metadata"]["uid"] != owner.get("uid")
        return False

    def _maybe_evict(self, workload: Obj) -> None:
        reason = message = ""
        if workload["spec"].get("active") is False:
            reason, message = "Deactivated", "The workload is deactivated"
        else:
            cq_name = workload["status"].get("admission", {}).get("clusterQueue", "")
            cq = self.get(CLUSTER_QUEUES, "", cq_name)
            if cq is not None and (cq.get("spec") or {}).get("stopPolicy") == "HoldAndDrain":
                reason, message = "ClusterQueueStopped", "The ClusterQueue is stopped"
        if reason:
            self._evict(workload, reason, message)

    def _evict(self, workload: Obj, reason: str, message: str) -> None:
        def evicted(w: Obj) -> None:
            status = w.setdefault("status", {})
            set_condition(status, "Evicted", "True", reason, message)
            set_condition(status, "QuotaReserved", "False", "Pending", message)
            set_condition(
                status, "Admitted", "False", "NoReservation", "The workload has no reservation"
            )
            if condition(w, "PodsReady") is not None:
                set_condition(
                    status,
                    "PodsReady",
                    "False",
                    "WaitForStart",
                    "Not all pods are ready or succeeded",
                )
            requeued = reason != "Deactivated"
            set_condition(status, "Requeued", "True" if requeued else "False", reason, message)
            status.pop("admission", None)

        self.mutate(WORKLOADS, workload, evicted, status=True)
        self.topology.pop(workload["metadata"]["uid"], None)
        self.events.emit(workload, "Workload", "EvictedDue" + reason, message)
