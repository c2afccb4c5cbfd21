"""The kinds the API serves, and which roles may read and write each."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from service.app.auth import Role
from service.app.schemas import (
    ClusterQueueSpec,
    ClusterSpec,
    CohortSpec,
    LocalQueueSpec,
    ResourceFlavorSpec,
    TopologySpec,
    TrainingRuntimeSpec,
    WorkloadPriorityClassSpec,
)
from service.app.workloads import WorkloadSpec

_EVERYONE = frozenset(Role)
TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    namespaced: bool
    spec: type[BaseModel]
    read: frozenset[Role]
    write: frozenset[Role]
    flat: bool = False
    """WorkloadPriorityClass keeps its fields at the top level, as Kueue's does."""
    crd: str | None = None
    """The apiVersion of the upstream kind whose CRD (``service/app/crds``) reads
    the spec, and which a manifest may carry as it is (Kubeflow's runtimes)."""


#: ``status.collection.state`` of a deleted Cluster once the fleet loop has
#: finished removing our objects from the member (or given up): until then
#: the name stays taken (workers/collect.py).
COLLECTION_ENDED = frozenset({"Collected", "Failed"})

QUOTA_WRITERS = frozenset({Role.QUEUE_ADMIN, Role.ADMIN})
#: Who may make a ClusterQueue's security floor weaker (service/app/floor.py).
FLOOR_RELAXERS = frozenset({Role.SECURITY_ADMIN, Role.ADMIN})
CLUSTER_WRITERS = frozenset({Role.CLUSTER_ADMIN, Role.ADMIN})

KINDS: dict[str, Kind] = {
    k.plural: k
    for k in (
        Kind(
            "ResourceFlavor", "resourceflavors", False, ResourceFlavorSpec, _EVERYONE, QUOTA_WRITERS
        ),
        Kind("Topology", "topologies", False, TopologySpec, _EVERYONE, QUOTA_WRITERS),
        Kind("Cohort", "cohorts", False, CohortSpec, _EVERYONE, QUOTA_WRITERS),
        # A security admin writes only a ClusterQueue's securityPolicy
        # (service/app/resources.py checks what changed).
        Kind(
            "ClusterQueue",
            "clusterqueues",
            False,
            ClusterQueueSpec,
            _EVERYONE,
            QUOTA_WRITERS | {Role.SECURITY_ADMIN},
        ),
        Kind(
            "WorkloadPriorityClass",
            "workloadpriorityclasses",
            False,
            WorkloadPriorityClassSpec,
            _EVERYONE,
            QUOTA_WRITERS,
            flat=True,
        ),
        Kind("LocalQueue", "localqueues", True, LocalQueueSpec, _EVERYONE, QUOTA_WRITERS),
        # What a TrainJob's pods are made from (docs/workload-kinds.md): registered by
        # those who set quotas, read by everyone who submits.
        Kind(
            "TrainingRuntime",
            "trainingruntimes",
            True,
            TrainingRuntimeSpec,
            _EVERYONE,
            QUOTA_WRITERS,
            crd=TRAINER_API_VERSION,
        ),
        Kind(
            "ClusterTrainingRuntime",
            "clustertrainingruntimes",
            False,
            TrainingRuntimeSpec,
            _EVERYONE,
            QUOTA_WRITERS,
            crd=TRAINER_API_VERSION,
        ),
        Kind(
            "Cluster",
            "clusters",
            False,
            ClusterSpec,
            frozenset({Role.CLUSTER_ADMIN, Role.ADMIN, Role.QUEUE_ADMIN, Role.AUDITOR}),
            CLUSTER_WRITERS,
        ),
        Kind(
            "Workload",
            "workloads",
            True,
            WorkloadSpec,
            frozenset({Role.SUBMITTER, Role.ADMIN, Role.QUEUE_ADMIN, Role.AUDITOR}),
            frozenset({Role.SUBMITTER, Role.ADMIN}),
        ),
    )
}
BY_KIND = {k.kind: k for k in KINDS.values()}
ADMIN_KINDS = [k for k in KINDS.values() if k.kind != "Workload"]
