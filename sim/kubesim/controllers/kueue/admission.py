"""The admission cycle (Kueue's ``pkg/scheduler``): pending Workloads by priority then
age, a flavor per resource group where quota and topology allow, and the
``QuotaReserved``/``Admitted`` conditions that record the outcome."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sim.kubesim.controllers.base import condition, is_true, pod_requests, set_condition
from sim.kubesim.controllers.kueue.flavorassigner import Placements, flavor_mismatch
from sim.kubesim.controllers.kueue.queues import QueueStatuses
from sim.kubesim.controllers.kueue.quota import Ledger
from sim.kubesim.controllers.kueue.workload import (
    CLUSTER_QUEUES,
    FLAVORS,
    LOCAL_QUEUES,
    WORKLOADS,
    admission_usage,
    is_pending,
    is_reserving,
)
from sim.kubesim.quantity import resource_quantity
from sim.kubesim.selectors import match_selector_object

__all__ = ["AdmissionCycle"]

Obj = dict[str, Any]


class AdmissionCycle(QueueStatuses):
    """Admits what fits, then writes the queues' statuses from the same ledger."""

    def _cycle(self) -> None:
        cqs = {cq["metadata"]["name"]: cq for cq in self.items(CLUSTER_QUEUES)}
        ledger = Ledger(cqs)
        workloads = self.items(WORKLOADS)
        for workload in workloads:
            if is_reserving(workload):
                admission = workload["status"]["admission"]
                if admission.get("clusterQueue") in cqs:
                    ledger.add(admission["clusterQueue"], admission_usage(admission))
        pending = sorted(
            (w for w in workloads if is_pending(w)),
            key=lambda w: (
                -int(w["spec"].get("priority", 0)),
                w["metadata"].get("creationTimestamp", ""),
                w["metadata"]["name"],
            ),
        )
        blocked: set[str] = set()
        placements = Placements(self.items)
        for workload in pending:
            self._consider(workload, cqs, ledger, blocked, placements)
        for for_cleanup in list(self.topology):
            if not any(w["metadata"]["uid"] == for_cleanup for w in workloads):
                self.topology.pop(for_cleanup, None)
        self._queue_statuses(cqs, ledger, self.items(WORKLOADS))

    def _consider(
        self,
        workload: Obj,
        cqs: dict[str, Obj],
        ledger: Ledger,
        blocked: set[str],
        placements: Placements,
    ) -> None:
        namespace = workload["metadata"]["namespace"]
        queue = workload["spec"].get("queueName", "")
        lq = self.get(LOCAL_QUEUES, namespace, queue)
        if lq is None:
            self._mark_pending(workload, "Inadmissible", f"LocalQueue {queue} doesn't exist")
            return
        cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
        cq = cqs.get(cq_name)
        if cq is None:
            self._mark_pending(workload, "Inadmissible", f"ClusterQueue {cq_name} doesn't exist")
            return
        inactive = self._inactive_reason(cq)
        if inactive:
            self._mark_pending(workload, "Inadmissible", f"ClusterQueue {cq_name} is inactive")
            return
        ns = self.get("namespaces", "", namespace)
        ns_labels = (ns or {}).get("metadata", {}).get("labels") or {}
        if not match_selector_object((cq.get("spec") or {}).get("namespaceSelector"), ns_labels):
            self._mark_pending(
                workload, "Inadmissible", "Workload namespace doesn't match ClusterQueue selector"
            )
            return
        if cq_name in blocked:
            self._mark_pending(
                workload,
                "Pending",
                "Workload is waiting for the head of its StrictFIFO ClusterQueue",
            )
            return
        assignment, message = self._assign(workload, cq_name, cq, ledger, placements)
        if assignment is None:
            self._mark_pending(workload, "Pending", message)
            if (cq.get("spec") or {}).get("queueingStrategy") == "StrictFIFO":
                blocked.add(cq_name)
            return
        ledger.add(cq_name, admission_usage({"podSetAssignments": assignment}))
        self._admit(workload, cq_name, assignment)

    def _assign(
        self, workload: Obj, cq_name: str, cq: Obj, ledger: Ledger, placements: Placements
    ) -> tuple[list[Obj] | None, str]:
        groups = (cq.get("spec") or {}).get("resourceGroups") or []
        assignments = []
        trial: Counter[tuple[str, str]] = Counter()
        topology: dict[str, dict[str, str]] = {}
        for pod_set in workload["spec"].get("podSets") or ():
            template = pod_set.get("template") or {}
            count = int(pod_set.get("count", 1))
            per_pod = pod_requests(template.get("spec") or {})
            total = {name: amount * count for name, amount in per_pod.items() if amount}
            flavors: dict[str, str] = {}
            for resource in total:
                if not any(resource in g.get("coveredResources", ()) for g in groups):
                    return (
                        None,
                        f"couldn't assign flavors to pod set {pod_set['name']}: "
                        f"resource {resource} unavailable in ClusterQueue",
                    )
            domain: dict[str, str] = {}
            for group in groups:
                wanted = {r: a for r, a in total.items() if r in group.get("coveredResources", ())}
                if not wanted:
                    continue
                chosen, reasons, chosen_domain = self._pick_flavor(
                    cq_name, group, pod_set, wanted, per_pod, count, ledger, trial, placements
                )
                if chosen is None:
                    return (
                        None,
                        f"couldn't assign flavors to pod set {pod_set['name']}: "
                        f"{', '.join(reasons)}",
                    )
                domain.update(chosen_domain)
                for resource, amount in wanted.items():
                    flavors[resource] = chosen
                    trial[(chosen, resource)] += amount
            if domain:
                topology[pod_set["name"]] = domain
            assignments.append(
                {
                    "name": pod_set["name"],
                    "flavors": flavors,
                    "resourceUsage": {r: resource_quantity(r, a) for r, a in total.items()},
                    "count": count,
                }
            )
        self.topology[workload["metadata"]["uid"]] = topology
        return assignments, ""

    def _pick_flavor(
        self,
        cq_name: str,
        group: Obj,
        pod_set: Obj,
        wanted: dict[str, int],
        per_pod: dict[str, int],
        count: int,
        ledger: Ledger,
        trial: Counter[tuple[str, str]],
        placements: Placements,
    ) -> tuple[str | None, list[str], dict[str, str]]:
        template_spec = (pod_set.get("template") or {}).get("spec") or {}
        label_keys = {
            key
            for entry in group.get("flavors") or ()
            for key in ((self.get(FLAVORS, "", entry["name"]) or {}).get("spec") or {}).get(
                "nodeLabels", {}
            )
        }
        reasons: list[str] = []
        for entry in group.get("flavors") or ():
            flavor = self.get(FLAVORS, "", entry["name"]) or {"spec": {}}
            problem = flavor_mismatch(entry["name"], flavor, template_spec, label_keys)
            if problem:
                reasons.append(problem)
                continue
            misses = [
                why
                for resource, amount in wanted.items()
                if (
                    why := ledger.check(
                        cq_name, entry["name"], resource, amount + trial[(entry["name"], resource)]
                    )
                )
            ]
            if misses:
                reasons.extend(misses)
                continue
            domain, why = placements.find(pod_set, flavor, per_pod, count)
            if why:
                reasons.append(why)
                continue
            return entry["name"], [], domain
        return None, reasons, {}

    def _mark_pending(self, workload: Obj, reason: str, message: str) -> None:
        current = condition(workload, "QuotaReserved")
        if current is not None and (
            current.get("status"),
            current.get("reason"),
            current.get("message"),
        ) == (
            "False",
            reason,
            message,
        ):
            return

        def pending(w: Obj) -> None:
            set_condition(w.setdefault("status", {}), "QuotaReserved", "False", reason, message)

        self.mutate(WORKLOADS, workload, pending, status=True)

    def _admit(self, workload: Obj, cq_name: str, assignments: list[Obj]) -> None:
        def admitted(w: Obj) -> None:
            status = w.setdefault("status", {})
            status["admission"] = {"clusterQueue": cq_name, "podSetAssignments": assignments}
            set_condition(
                status,
                "QuotaReserved",
                "True",
                "QuotaReserved",
                f"Quota reserved in ClusterQueue {cq_name}",
            )
            set_condition(status, "Admitted", "True", "Admitted", "The workload is admitted")
            if is_true(w, "Evicted"):
                set_condition(status, "Evicted", "False", "QuotaReserved", "Previously: evicted")
            if condition(w, "Requeued") is not None:
                set_condition(
                    status, "Requeued", "True", "QuotaReserved", "The workload was requeued"
                )

        updated = self.mutate(WORKLOADS, workload, admitted, status=True)
        self.events.emit(
            updated,
            "Workload",
            "QuotaReserved",
            f"Quota reserved in ClusterQueue {cq_name}, wait time since queued was 0s",
        )
        self.events.emit(
            updated,
            "Workload",
            "Admitted",
            f"Admitted by ClusterQueue {cq_name}, wait time since reservation was 0s",
        )
