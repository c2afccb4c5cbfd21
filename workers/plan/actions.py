"""desired vs actual: the actions that make a member match the centre."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workers.plan.desired import PlanMemo, desired
from workers.plan.names import (
    ADMISSION_LABEL,
    BACKEND_QUEUE_KINDS,
    GROUP_KIND,
    RUN_KINDS,
    SERVING_JOB_KINDS,
    WORKLOAD_ANNOTATION,
)
from workers.plan.serving import pods_per_unit, units
from workers.plan.views import Actions, ClusterView, Obj, Ref
from workers.plan.volcano import emptied_queue, volcano_desired

# -- plan ------------------------------------------------------------------------------------


def _contains(actual: Any, wanted: Any) -> bool:
    """Whether ``actual`` already holds every field of ``wanted`` (so that an
    apply would change nothing; quantities compared canonically)."""
    if isinstance(wanted, Mapping):
        if not isinstance(actual, Mapping):
            return False
        return all(_contains(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(_contains(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return actual == wanted or str(actual) == str(wanted)


def _job_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (
        str((meta.get("annotations") or {}).get(WORKLOAD_ANNOTATION, "")),
        str((meta.get("labels") or {}).get(ADMISSION_LABEL, "")),
    )


def plan(
    view: ClusterView, actual: Sequence[Mapping[str, Any]], memo: PlanMemo | None = None
) -> Actions:
    """``actual``: the member's objects that carry our managed label;
    ``memo``: as for :func:`desired`."""
    actions = Actions()
    refs = [Ref.of(o) for o in actual]
    jobs = [(r, o, _job_key(o)) for r, o in zip(refs, actual, strict=True) if r.kind in RUN_KINDS]
    present = {key for _, _, key in jobs}
    volcano = view.backend == "volcano"
    want = (volcano_desired if volcano else desired)(view, present, memo)
    queue_kinds = BACKEND_QUEUE_KINDS["volcano" if volcano else "kueue"]
    occupied = {ref for ref, _, _ in jobs}
    for ref, obj, key in jobs:
        if key not in want.jobs and key not in want.held:
            actions.draining.append(key[1])
            if not (obj.get("metadata") or {}).get("deletionTimestamp"):
                actions.delete.append(ref)
    # A Volcano gang's PodGroup goes with its job: preemption and eviction
    # remove the whole group.
    for ref, obj in zip(refs, actual, strict=True):
        key = _job_key(obj)
        unwanted = key not in want.jobs and key not in want.held
        if ref.kind == GROUP_KIND and unwanted and not obj["metadata"].get("deletionTimestamp"):
            actions.delete.append(ref)
    on_cluster = dict(zip(refs, actual, strict=True))
    for ns in want.namespaces.values():
        if Ref.of(ns) not in on_cluster:
            actions.apply.append(ns)
    queues = sorted(want.queues.items())
    for kind in reversed(queue_kinds):  # flavors, then ClusterQueues, then LocalQueues
        for ref, obj in queues:
            if ref.kind == kind and not _contains(on_cluster.get(ref), obj):
                actions.apply.append(obj)
    for key, job in sorted(want.jobs.items()):
        if key not in present and Ref.of(job) not in occupied:
            actions.dispatch.append(job)
            if key in want.groups:
                actions.groups[str(Ref.of(job))] = want.groups[key]
    for ref, obj, key in jobs:
        if key in want.replicas and ref.kind in SERVING_JOB_KINDS:
            _scale(actions, ref, obj, want.replicas[key])
            if key in want.groups and volcano:
                _regroup(actions, on_cluster, want.groups[key])
    unused = [ref for ref in refs if ref.kind in queue_kinds and ref not in want.queues]
    if volcano:
        # Volcano deletes only a Closed Queue (its webhook refuses the rest),
        # and closing one is a command to its controller: an unused Queue
        # is kept, holding nothing and admitting nothing (capability 0).
        for ref in [r for r in unused if r.kind == "Queue"]:
            emptied = emptied_queue(on_cluster[ref])
            if not _contains(on_cluster[ref], emptied):
                actions.apply.append(emptied)
        unused = [r for r in unused if r.kind != "Queue"]
    for kind in queue_kinds:
        actions.collect += [ref for ref in unused if ref.kind == kind]
    running = {key for key, _ in present}
    for workload in view.workloads:
        if workload.key in running:
            continue
        if (
            workload.state == "Evicted"
            and (workload.status.get("eviction") or {}).get("cluster") == view.cluster
            and workload.spec.get("active", True) is not False  # deactivated: stays Evicted
        ):
            actions.requeue.append(workload.key)
        elif workload.state == "Cancelling" and (
            workload.admission.get("cluster") == view.cluster or units(workload, view.cluster)
        ):
            actions.cancelled.append(workload.key)
    return actions


def _scale(actions: Actions, ref: Ref, held: Mapping[str, Any], want: int) -> None:
    """A serving member object the member holds, scaled in place to the
    count the centre admitted there (never deleted and made again: its
    running replicas stay)."""
    if (held.get("metadata") or {}).get("deletionTimestamp"):
        return
    have = (held.get("spec") or {}).get("replicas")
    if have == want:
        return
    if isinstance(have, int) and want < have:
        actions.scale_down.append((ref, want))
        actions.shrinking[_job_key(held)[1]] = want * pods_per_unit(held)
    else:
        actions.scale_up.append((ref, want))


def _regroup(actions: Actions, on_cluster: Mapping[Ref, Any], group: Obj) -> None:
    """A serving object's PodGroup, applied again when what it holds changed
    (its replicas scaled: ``minResources`` follows the centre's count)."""
    if not _contains(on_cluster.get(Ref.of(group)), group):
        actions.apply.append(group)
