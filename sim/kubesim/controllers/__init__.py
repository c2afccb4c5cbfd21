"""The controllers that make a simulated cluster behave like one: scheduler, kubelet,
Job / JobSet / PyTorchJob / MPIJob controllers, the apps/v1 controllers (Deployment,
ReplicaSet, StatefulSet), LeaderWorkerSet's, KubeRay's (RayCluster, RayJob) and a
Kueue-like admission loop — or,
on a Volcano member, a Volcano-like scheduler and Job controller in its place.

All run on the server's event loop and write through the same API core as
clients do; see :mod:`sim.kubesim.controllers.base`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from sim.kubesim.controllers.apps import (
    DeploymentController,
    ReplicaSetController,
    StatefulSetController,
)
from sim.kubesim.controllers.jobs import JobController
from sim.kubesim.controllers.jobset import JobSetController
from sim.kubesim.controllers.kueue import KueueController
from sim.kubesim.controllers.lws import LeaderWorkerSetController
from sim.kubesim.controllers.nodes import Kubelet, Scheduler
from sim.kubesim.controllers.ray import RayClusterController, RayJobController
from sim.kubesim.controllers.training import MPIJobController, PyTorchJobController
from sim.kubesim.controllers.volcano import (
    VolcanoJobController,
    VolcanoQueueController,
    VolcanoScheduler,
)

if TYPE_CHECKING:
    from sim.kubesim.cluster import SimCluster

__all__ = ["start_controllers"]


def start_controllers(cluster: SimCluster, loop: asyncio.AbstractEventLoop) -> list[Any]:
    """Kubelet first: chaos hooks (node readiness, pod failure) are looked up in this order."""
    common: tuple[type[Any], ...] = (
        Kubelet,
        Scheduler,
        JobController,
        JobSetController,
        PyTorchJobController,
        MPIJobController,
        DeploymentController,
        ReplicaSetController,
        StatefulSetController,
        LeaderWorkerSetController,
        RayClusterController,
        RayJobController,
    )
    backend: tuple[type[Any], ...] = (
        (VolcanoScheduler, VolcanoJobController, VolcanoQueueController)
        if cluster.backend == "volcano"
        else (KueueController,)
    )
    return [kind(cluster, loop) for kind in common + backend]
