"""What the parts of the Kueue-like controller share: its name, the index of Workloads
by owning job, the topology domains of this cycle's admissions, and the finalizer."""

from __future__ import annotations

from typing import Any

from sim.kubesim.controllers.base import Reconciler, controller_of
from sim.kubesim.controllers.kueue.workload import RESOURCE_IN_USE, WORKLOADS

__all__ = ["KueueReconciler"]

Obj = dict[str, Any]


class KueueReconciler(Reconciler):
    """The base of every part; :class:`KueueController` sets the state up."""

    name = "kueue"
    manager = "kueue"
    #: Owning job's uid → its Workload's (namespace, name).
    workload_of: dict[str, tuple[str, str]]
    #: Workload uid → pod set → the topology domain (node labels) it was admitted to.
    topology: dict[str, dict[str, dict[str, str]]]

    def _drop_finalizer(self, workload: Obj) -> None:
        self.mutate(
            WORKLOADS,
            workload,
            lambda w: w["metadata"].__setitem__(
                "finalizers",
                [f for f in w["metadata"].get("finalizers") or () if f != RESOURCE_IN_USE],
            ),
        )

    def _index(self, workload: Obj, *, deleted: bool = False) -> None:
        owner = controller_of(workload)
        if owner is None:
            return
        key = (workload["metadata"]["namespace"], workload["metadata"]["name"])
        if deleted:
            if self.workload_of.get(owner.get("uid", "")) == key:
                del self.workload_of[owner["uid"]]
        else:
            self.workload_of[owner.get("uid", "")] = key
