"""ClusterQueue and LocalQueue controllers' part: whether a queue is active, its
workload counts and flavor usage in status, and the in-use finalizer of queues and
flavors."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from sim.kubesim.controllers.base import is_true, set_condition
from sim.kubesim.controllers.kueue.quota import Ledger
from sim.kubesim.controllers.kueue.reconciler import KueueReconciler
from sim.kubesim.controllers.kueue.workload import (
    CLUSTER_QUEUES,
    FLAVORS,
    LOCAL_QUEUES,
    RESOURCE_IN_USE,
    WORKLOADS,
    admission_usage,
    is_pending,
    is_reserving,
)
from sim.kubesim.quantity import resource_quantity
from sim.kubesim.store import clone

__all__ = ["QueueStatuses"]

Obj = dict[str, Any]


class QueueStatuses(KueueReconciler):
    """Status and finalizers of ClusterQueues, LocalQueues and ResourceFlavors."""

    def _inactive_reason(self, cq: Obj) -> str:
        spec = cq.get("spec") or {}
        if spec.get("stopPolicy", "None") != "None":
            return "Stopped"
        missing = self._missing_flavors(cq)
        return "FlavorNotFound" if missing else ""

    def _missing_flavors(self, cq: Obj) -> list[str]:
        names = [
            f["name"]
            for g in (cq.get("spec") or {}).get("resourceGroups") or ()
            for f in g.get("flavors") or ()
        ]
        return [name for name in names if self.get(FLAVORS, "", name) is None]

    def _ensure_finalizer(self, resource_key: str, namespace: str, name: str) -> None:
        obj = self.get(resource_key, namespace, name)
        if obj is None:
            return
        finalizers = obj["metadata"].get("finalizers") or []
        in_use = self._in_use(resource_key, name)
        if obj["metadata"].get("deletionTimestamp"):
            if not in_use and RESOURCE_IN_USE in finalizers:
                self.mutate(
                    resource_key,
                    obj,
                    lambda o: o["metadata"].__setitem__(
                        "finalizers", [f for f in finalizers if f != RESOURCE_IN_USE]
                    ),
                )
            return
        if RESOURCE_IN_USE not in finalizers:
            self.mutate(
                resource_key,
                obj,
                lambda o: o["metadata"].__setitem__("finalizers", [*finalizers, RESOURCE_IN_USE]),
            )

    def _in_use(self, resource_key: str, name: str) -> bool:
        for workload in self.items(WORKLOADS):
            if not is_reserving(workload):
                continue
            admission = workload["status"].get("admission") or {}
            if resource_key == CLUSTER_QUEUES and admission.get("clusterQueue") == name:
                return True
            if resource_key == FLAVORS:
                for assignment in admission.get("podSetAssignments") or ():
                    if name in (assignment.get("flavors") or {}).values():
                        return True
        return False

    def _queue_statuses(self, cqs: dict[str, Obj], ledger: Ledger, workloads: list[Obj]) -> None:
        per_cq: dict[str, Counter[str]] = defaultdict(Counter)
        per_lq: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        lq_usage: dict[tuple[str, str], Counter[tuple[str, str]]] = defaultdict(Counter)
        lq_target = {
            (lq["metadata"]["namespace"], lq["metadata"]["name"]): (lq.get("spec") or {}).get(
                "clusterQueue", ""
            )
            for lq in self.items(LOCAL_QUEUES)
        }
        for workload in workloads:
            lq_key = (workload["metadata"]["namespace"], workload["spec"].get("queueName", ""))
            cq_name = lq_target.get(lq_key, "")
            if is_reserving(workload):
                state = "admitted" if is_true(workload, "Admitted") else "reserving"
                cq_name = workload["status"]["admission"].get("clusterQueue", cq_name)
                for flavor, resource, amount in admission_usage(workload["status"]["admission"]):
                    lq_usage[lq_key][(flavor, resource)] += amount
                per_cq[cq_name]["reserving"] += 1
                per_lq[lq_key]["reserving"] += 1
                if state == "admitted":
                    per_cq[cq_name]["admitted"] += 1
                    per_lq[lq_key]["admitted"] += 1
            elif is_pending(workload):
                per_cq[cq_name]["pending"] += 1
                per_lq[lq_key]["pending"] += 1
        for name, cq in cqs.items():
            self._write_cq_status(cq, per_cq[name], ledger)
        for lq in self.items(LOCAL_QUEUES):
            key = (lq["metadata"]["namespace"], lq["metadata"]["name"])
            self._write_lq_status(lq, per_lq[key], lq_usage[key], cqs)

    def _write_cq_status(self, cq: Obj, counts: Counter[str], ledger: Ledger) -> None:
        name = cq["metadata"]["name"]
        flavors = []
        for group in (cq.get("spec") or {}).get("resourceGroups") or ():
            for entry in group.get("flavors") or ():
                resources = []
                for resource in entry.get("resources") or ():
                    used = ledger.used[name][(entry["name"], resource["name"])]
                    nominal = ledger.quotas[name][(entry["name"], resource["name"])].nominal
                    resources.append(
                        {
                            "name": resource["name"],
                            "total": resource_quantity(resource["name"], used),
                            "borrowed": resource_quantity(resource["name"], max(0, used - nominal)),
                        }
                    )
                flavors.append({"name": entry["name"], "resources": resources})
        inactive = self._inactive_reason(cq)

        def status(obj: Obj) -> None:
            st = obj.setdefault("status", {})
            st.update(
                pendingWorkloads=counts["pending"],
                reservingWorkloads=counts["reserving"],
                admittedWorkloads=counts["admitted"],
                flavorsReservation=flavors,
                flavorsUsage=clone(flavors),
            )
            if inactive == "FlavorNotFound":
                missing = ", ".join(self._missing_flavors(cq))
                set_condition(
                    st,
                    "Active",
                    "False",
                    "FlavorNotFound",
                    "Can't admit new workloads: references missing ResourceFlavor(s): "
                    f"[{missing}].",
                )
            elif inactive == "Stopped":
                set_condition(
                    st, "Active", "False", "Stopped", "Can't admit new workloads: is stopped."
                )
            else:
                set_condition(st, "Active", "True", "Ready", "Can admit new workloads")

        self.mutate(CLUSTER_QUEUES, cq, status, status=True)

    def _write_lq_status(
        self, lq: Obj, counts: Counter[str], usage: Counter[tuple[str, str]], cqs: dict[str, Obj]
    ) -> None:
        flavors: dict[str, list[Obj]] = defaultdict(list)
        for (flavor, resource), amount in sorted(usage.items()):
            flavors[flavor].append({"name": resource, "total": resource_quantity(resource, amount)})
        listed = [{"name": flavor, "resources": resources} for flavor, resources in flavors.items()]
        cq_name = (lq.get("spec") or {}).get("clusterQueue", "")

        def status(obj: Obj) -> None:
            st = obj.setdefault("status", {})
            st.update(
                pendingWorkloads=counts["pending"],
                reservingWorkloads=counts["reserving"],
                admittedWorkloads=counts["admitted"],
                flavorsReservation=listed,
                flavorsUsage=clone(listed),
            )
            if cq_name in cqs:
                set_condition(
                    st, "Active", "True", "Ready", "Can submit new workloads to localQueue"
                )
            else:
                set_condition(
                    st,
                    "Active",
                    "False",
                    "ClusterQueueDoesNotExist",
                    "Can't submit new workloads to clusterQueue",
                )

        self.mutate(LOCAL_QUEUES, lq, status, status=True)
