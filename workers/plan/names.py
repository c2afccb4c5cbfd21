"""Names and labels of what the planner writes to a member: deterministic,
within Kubernetes' length limits, never colliding."""

from __future__ import annotations

import functools
import hashlib

from service.domain.jobs import MEMBER_JOB_KINDS
from workers.plan.views import WorkloadView

MANAGED_LABEL = "quartermaster.dev/managed"
MANAGED = f"{MANAGED_LABEL}=true"
#: The uid of the Cluster registration that wrote an object: what a deleted
#: registration's collection may remove (workers/collect.py), and nothing
#: a later registration of the same member wrote.
CLUSTER_UID_LABEL = "quartermaster.dev/cluster-uid"
WORKLOAD_LABEL = "quartermaster.dev/workload"
ADMISSION_LABEL = "quartermaster.dev/admission"
#: The ledger id of the admission (its ``workload.admitted`` entry): what it ran is billed to.
ADMISSION_ID_ANNOTATION = "quartermaster.dev/admission-id"
#: On every pod of ours, from its creation: it stays, ended, until the centre has read
#: what it ran (workers/metering.py).
USAGE_FINALIZER = "quartermaster.dev/usage"
WORKLOAD_ANNOTATION = "quartermaster.dev/workload"
#: Set by the job itself (its code, or an operator's hook) to the RFC 3339 time of
#: its last saved checkpoint; sync records it, the engine's victim order weighs it.
CHECKPOINT_ANNOTATION = "quartermaster.dev/last-checkpoint"
UID_ANNOTATION = "quartermaster.dev/workload-uid"
PRIORITY_ANNOTATION = "quartermaster.dev/priority"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SIM_ANNOTATIONS = ("quartermaster.dev/sim-duration", "quartermaster.dev/sim-exit")
#: The serving kinds, run as one member object per placement of their
#: admitted replicas (workers/plan/serving.py), scaled in place. Listed on
#: a member only while a serving workload is there (job_kinds): a member
#: whose role grants no apps/v1 or LeaderWorkerSets is never asked for them.
SERVING_JOB_KINDS = ("Deployment", "StatefulSet", "LeaderWorkerSet")
#: The jobs the workers apply to members and list on every pass; a workload
#: of another kind is never admitted (service/app/admission/snapshot.py
#: holds it pending), but for the serving kinds.
JOB_KINDS = tuple(k for k in MEMBER_JOB_KINDS if k not in SERVING_JOB_KINDS)
#: Every kind of member object that runs a workload of ours.
RUN_KINDS = (*JOB_KINDS, *SERVING_JOB_KINDS)
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: Deletion order (applied in reverse).
QUEUE_KINDS = ("LocalQueue", "ClusterQueue", "ResourceFlavor", "WorkloadPriorityClass")
#: A Volcano member's queue objects, in deletion order (applied in reverse).
VOLCANO_QUEUE_KINDS = ("Queue", "PriorityClass")
#: Per backend, the queue objects that mirror the centre there.
BACKEND_QUEUE_KINDS = {"kueue": QUEUE_KINDS, "volcano": VOLCANO_QUEUE_KINDS}
#: The object that binds a gang on a Volcano member.
GROUP_KIND = "PodGroup"
#: What asks Volcano's controllers for an action (closing a Queue), and where
#: ``vcctl`` puts it.
COMMAND_API_VERSION = "bus.volcano.sh/v1alpha1"
COMMAND_NAMESPACE = "default"
#: Volcano's scheduler name and the pod annotation naming a pod's PodGroup.
VOLCANO_SCHEDULER = "volcano"
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
RUNS_HERE = frozenset({"Admitted", "Running"})
API_VERSIONS = {
    "Namespace": "v1",
    "ResourceFlavor": "kueue.x-k8s.io/v1beta2",
    "ClusterQueue": "kueue.x-k8s.io/v1beta2",
    "LocalQueue": "kueue.x-k8s.io/v1beta2",
    "WorkloadPriorityClass": "kueue.x-k8s.io/v1beta2",
    "Job": "batch/v1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "Queue": "scheduling.volcano.sh/v1beta1",
    "PodGroup": "scheduling.volcano.sh/v1beta1",
    "PriorityClass": "scheduling.k8s.io/v1",
}
#: Kueue's caps: flavors in one resource group, in one ClusterQueue; a
#: ResourceFlavor's node labels.
MAX_FLAVORS = 64
MAX_FLAVORS_TOTAL = 256
MAX_NODE_LABELS = 8


# -- names -----------------------------------------------------------------------------------


def short_name(value: str, limit: int = 63) -> str:
    """``value`` if it fits, else a prefix and a hash (deterministic)."""
    if len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:10]
    return f"{value[: limit - 11].rstrip('-.')}-{digest}"


@functools.lru_cache(maxsize=8192)
def dns_label(value: str) -> str:
    return "".join(c if c.isalnum() or c == "-" else "-" for c in value.lower()).strip("-")


def job_name(workload: WorkloadView) -> str:
    """The workload's own name when it is a DNS label; otherwise a label
    made of it and a hash of it (``a.b`` and ``a-b`` must not collide)."""
    name = dns_label(workload.name)
    if name != workload.name:
        name = f"{name}-{hashlib.sha256(workload.name.encode()).hexdigest()[:6]}"
    return short_name(name)


def admission_id(workload: WorkloadView) -> str:
    """Names one admission: a job from an earlier admission of the same
    workload (requeued, admitted again) is stale, never adopted."""
    admission = workload.admission
    return _admission_hash(
        workload.uid, str(admission.get("cluster")), str(admission.get("admittedAt"))
    )


@functools.lru_cache(maxsize=65536)
def _admission_hash(uid: str, cluster: str, admitted_at: str) -> str:
    """Hashed once per admission, not once per pass for every gang in flight."""
    return hashlib.sha256(f"{uid}/{cluster}/{admitted_at}".encode()).hexdigest()[:16]


def workload_label(namespace: str, name: str) -> str:
    return short_name(f"{namespace}.{name}")


def priority_class_name(priority: int) -> str:
    """One member WorkloadPriorityClass per priority value (not per central
    class: a class whose value changes must not re-rank running gangs)."""
    return f"qm-p{priority}" if priority >= 0 else f"qm-m{-priority}"


@functools.lru_cache(maxsize=4096)
def flavor_name(flavor: str, island: str | None) -> str:
    return short_name(dns_label(f"qm-{flavor}-{island}" if island else f"qm-{flavor}"), 253)


def managed_labels(**extra: str) -> dict[str, str]:
    return {MANAGED_LABEL: "true", **extra}
