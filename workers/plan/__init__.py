"""Pure planners: what one member cluster should hold, given the centre's
decisions, against what it holds; and the events sync derives from it.

No I/O here: the reconciler (workers/reconcile.py) loads the read models and
lists the member cluster, calls :func:`plan` (``actions.py``), and carries the actions out.

The centre stays the only quota authority. Each member ClusterQueue
``qm-<cq>`` mirrors the central ClusterQueue's resource groups (a pod set
admitted with cpu of one flavor and GPUs of another fits, as it did
centrally): per group, one member flavor per central flavor and island
(``qm-<flavor>-<island>``: the flavor's node labels plus the island's
label), each listing the group's covered resources with a nominal quota of
exactly what the centre admitted there; no cohort and no preemption. So it
cannot admit what the centre did not (nothing else is queued to it and
there is no room), nor block what it admitted (the quota is raised before
the job is created, and every admission reads as one flavor per group).
Admissions that no one ClusterQueue can hold together (the centre's groups
changed between them) go to further generations ``qm-<cq>.g<n>``; a group
that would pass Kueue's 64 flavors shares one island-less member flavor.
"""

from __future__ import annotations

from workers.plan.actions import plan
from workers.plan.desired import PlanMemo, desired
from workers.plan.jobs import job_kinds
from workers.plan.names import (
    ADMISSION_LABEL,
    CHECKPOINT_ANNOTATION,
    CLUSTER_UID_LABEL,
    GROUP_KIND,
    JOB_KINDS,
    MANAGED,
    MANAGED_LABEL,
    QUEUE_KINDS,
    QUEUE_LABEL,
    RUN_KINDS,
    RUNS_HERE,
    SERVING_JOB_KINDS,
    UID_ANNOTATION,
    VOLCANO_QUEUE_KINDS,
    WORKLOAD_ANNOTATION,
    WORKLOAD_LABEL,
    admission_id,
    job_name,
    workload_label,
)
from workers.plan.status import member_status, volcano_status
from workers.plan.views import Actions, ClusterView, Ref, WorkloadView
from workers.plan.volcano import close_command, tier_one_islands

__all__ = [
    "ADMISSION_LABEL",
    "CHECKPOINT_ANNOTATION",
    "CLUSTER_UID_LABEL",
    "GROUP_KIND",
    "JOB_KINDS",
    "MANAGED",
    "MANAGED_LABEL",
    "QUEUE_KINDS",
    "QUEUE_LABEL",
    "RUNS_HERE",
    "RUN_KINDS",
    "SERVING_JOB_KINDS",
    "UID_ANNOTATION",
    "VOLCANO_QUEUE_KINDS",
    "WORKLOAD_ANNOTATION",
    "WORKLOAD_LABEL",
    "Actions",
    "ClusterView",
    "PlanMemo",
    "Ref",
    "WorkloadView",
    "admission_id",
    "close_command",
    "desired",
    "job_kinds",
    "job_name",
    "member_status",
    "plan",
    "tier_one_islands",
    "volcano_status",
    "workload_label",
]
