"""The kinds the API serves: their plurals, scope and short names."""

from __future__ import annotations

import re
from dataclasses import dataclass

from quartermaster_client.models import (
    Cluster,
    ClusterQueue,
    ClusterTrainingRuntime,
    Cohort,
    LocalQueue,
    Resource,
    ResourceFlavor,
    Topology,
    TrainingRuntime,
    Workload,
    WorkloadPriorityClass,
)
from quartermaster_client.volcano import QUEUE_API_VERSION


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    namespaced: bool
    model: type[Resource]
    short: tuple[str, ...] = ()

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """``/v1/...`` for this kind; a namespaced kind without a namespace
        is the all-namespaces list."""
        base = (
            f"/v1/namespaces/{namespace}/{self.plural}"
            if self.namespaced and namespace
            else f"/v1/{self.plural}"
        )
        return f"{base}/{name}" if name else base


KINDS: tuple[Kind, ...] = (
    Kind("ResourceFlavor", "resourceflavors", False, ResourceFlavor, ("rf", "flavor", "flavors")),
    Kind("Topology", "topologies", False, Topology, ("topo",)),
    Kind("Cohort", "cohorts", False, Cohort, ()),
    Kind("ClusterQueue", "clusterqueues", False, ClusterQueue, ("cq", "cqs")),
    Kind("LocalQueue", "localqueues", True, LocalQueue, ("lq", "lqs", "queue", "queues")),
    Kind(
        "WorkloadPriorityClass",
        "workloadpriorityclasses",
        False,
        WorkloadPriorityClass,
        ("wpc", "priorityclass", "priorityclasses", "pc"),
    ),
    Kind("TrainingRuntime", "trainingruntimes", True, TrainingRuntime, ("tr",)),
    Kind(
        "ClusterTrainingRuntime", "clustertrainingruntimes", False, ClusterTrainingRuntime, ("ctr",)
    ),
    Kind("Cluster", "clusters", False, Cluster, ()),
    Kind("Workload", "workloads", True, Workload, ("wl", "wls")),
)
BY_KIND = {k.kind: k for k in KINDS}
_NAMES: dict[str, Kind] = {}
for _kind in KINDS:
    for _name in (_kind.kind.lower(), _kind.plural, *_kind.short):
        _NAMES[_name] = _kind

#: Kinds a platform admin applies; workloads are submitted instead.
ADMIN_KINDS = tuple(k for k in KINDS if k.kind != "Workload")
#: Order in which ``apply`` creates objects, so that references resolve.
APPLY_ORDER = (
    "Topology",
    "ResourceFlavor",
    "Cohort",
    "ClusterQueue",
    "LocalQueue",
    "WorkloadPriorityClass",
    "TrainingRuntime",
    "ClusterTrainingRuntime",
    "Cluster",
    "Workload",
)


#: API groups whose kinds Quartermaster serves: its own, and Kueue's (``apply``
#: translates them).
GROUPS = ("quartermaster.dev", "kueue.x-k8s.io")
#: API groups of the jobs a submission may carry (training jobs, and the
#: serving kinds: apps/v1 Deployment and StatefulSet, LeaderWorkerSet); the
#: server says which kinds (a DaemonSet is its refusal, not ours).
JOB_GROUPS = (
    "batch",
    "jobset.x-k8s.io",
    "kubeflow.org",
    "ray.io",
    "trainer.kubeflow.org",
    "batch.volcano.sh",
    "apps",
    "leaderworkerset.x-k8s.io",
)
#: Kubeflow Trainer's runtimes, applied as Trainer writes them (its TrainJob is a job).
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")


def lookup(name: str) -> Kind:
    """A kind by any of its names: ``ClusterQueue``, ``clusterqueues``, ``cq``,
    or one qualified by its group, ``localqueues.kueue.x-k8s.io``.

    Raises KeyError with the known names when there is no such kind, or the
    group is not one of ours (``queues.scheduling.volcano.sh``)."""
    short, dot, group = name.lower().partition(".")
    version, _, versioned = group.partition(".")
    if re.fullmatch(r"v\d+((alpha|beta)\d+)?", version):
        group = versioned  # kubectl's RESOURCE.VERSION.GROUP
    if dot and group not in GROUPS:
        raise KeyError(
            f"unknown kind {name!r}: {group} is not an API group Quartermaster serves "
            f"({', '.join(GROUPS)})"
        )
    found = _NAMES.get(short)
    if found is None:
        raise KeyError(
            f"unknown kind {name!r}; known: {', '.join(k.plural for k in KINDS)} "
            f"(short: {', '.join(s for k in KINDS for s in k.short[:1])})"
        )
    return found


def of_manifest(api_version: str, kind: str) -> Kind:
    """The kind a manifest becomes, by its ``apiVersion`` and exact ``kind`` as
    an API server reads them: one of ours, or Workload for a job (of a group
    in JOB_GROUPS, or one without apiVersion, which the server then judges).

    A Volcano ``Queue`` (``scheduling.volcano.sh/v1beta1``) becomes a
    ClusterQueue (quartermaster_client.volcano), never a LocalQueue, though
    ``queue`` is one's short name on the command line.

    Raises KeyError naming both for anything else."""
    if (api_version, kind) == (QUEUE_API_VERSION, "Queue"):
        return BY_KIND["ClusterQueue"]
    group = api_version.rpartition("/")[0] if api_version else None
    if group == "trainer.kubeflow.org" and kind in RUNTIME_KINDS:
        return BY_KIND[kind]
    if group is None or group in GROUPS:
        found = BY_KIND.get(kind)
        if found is not None or group is None:
            return found or BY_KIND["Workload"]
    elif group in JOB_GROUPS:
        return BY_KIND["Workload"]
    raise KeyError(
        f"apiVersion {api_version} kind {kind} is not something Quartermaster takes: "
        f"its kinds are {', '.join(k.kind for k in KINDS)} ({' or '.join(GROUPS)}); "
        f"jobs of {', '.join(JOB_GROUPS)} are submitted"
    )


def resolve(kind: str | Kind | type[Resource]) -> Kind:
    if isinstance(kind, Kind):
        return kind
    if isinstance(kind, type):
        return BY_KIND[kind.KIND]
    return lookup(kind)


__all__ = [
    "ADMIN_KINDS",
    "APPLY_ORDER",
    "BY_KIND",
    "GROUPS",
    "JOB_GROUPS",
    "KINDS",
    "Kind",
    "lookup",
    "of_manifest",
    "resolve",
]
