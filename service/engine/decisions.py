"""The cycle's decisions, in order: admissions with their victims, and evictions.

Recording a decision applies it to the cycle's state at once (quota and
capacity held or released), so later attempts see it. A preemptor's victims
are evicted, whole, before it is admitted.

Reference: kueue ``pkg/scheduler/scheduler.go`` (``admit``) and
``pkg/scheduler/preemption/preemption.go`` (``IssuePreemptions``).
"""

from __future__ import annotations

from service.domain.workload import Admission, PodSetAssignment, RequeueState
from service.engine.packing import GangPlacement
from service.engine.protection import preemptor_borrows
from service.engine.quota import FlavorResource
from service.engine.state import CQState, CycleState
from service.engine.types import AdmissionDecision, Eviction, EvictionReason, Preemption
from service.engine.workload_info import AdmittedInfo, WorkloadInfo

__all__ = ["Decisions"]

_HUMAN_REASON = {
    "InClusterQueue": "prioritization in the ClusterQueue",
    "InCohortReclamation": "reclamation within the cohort",
    "InCohortFairSharing": "fair sharing within the cohort",
    "InCohortReclaimWhileBorrowing": "reclamation within the cohort while borrowing",
    "Consolidation": "consolidation of a fabric island",
}


class Decisions:
    """Admissions, preemptions and other evictions, in decision order."""

    def __init__(self, state: CycleState) -> None:
        self.state = state
        self.admissions: list[AdmissionDecision] = []
        self.preemptions: list[Preemption] = []
        self.evictions: list[Eviction] = []

    def evict(
        self,
        info: AdmittedInfo,
        reason: EvictionReason,
        message: str,
        requeue: RequeueState | None = None,
        deactivated: bool = False,
    ) -> None:
        """Evict an admitted workload (not a preemption victim) for ``reason``."""
        self.state.evict(info)
        self.evictions.append(
            Eviction(
                workload=info.key,
                cluster_queue=info.cq_name,
                cluster=info.cluster,
                reason=reason,
                message=message,
                requeue_state=requeue,
                deactivated=deactivated,
            )
        )

    def admit(
        self,
        wi: WorkloadInfo,
        usage: dict[FlavorResource, int],
        pod_set_flavors: list[dict[str, str]],
        placement: GangPlacement,
        victims: list[tuple[AdmittedInfo, str]],
    ) -> None:
        """Admit ``wi`` where ``placement`` says, evicting its ``victims`` first."""
        assert wi.cq is not None
        cq = wi.cq
        if victims:
            self._preempt(wi, victims, usage)
        self.state.admit(wi, dict(usage), placement)
        self.admissions.append(
            AdmissionDecision(
                workload=wi.key,
                cluster_queue=cq.name,
                admission=Admission(
                    cluster_queue=cq.name,
                    cluster=placement.cluster,
                    pod_set_assignments=_pod_set_assignments(wi, pod_set_flavors, placement),
                ),
                borrowed=_borrowed(cq, usage),
                preempted=tuple([v.key for v, _ in victims]) if victims else (),
            )
        )

    def _preempt(
        self,
        wi: WorkloadInfo,
        victims: list[tuple[AdmittedInfo, str]],
        usage: dict[FlavorResource, int],
    ) -> None:
        """Evict the victims whole, each recorded with its reason and its preemptor."""
        assert wi.cq is not None
        cq = wi.cq
        preemptor_path = cq.node.path()
        state = self.state
        borrows = preemptor_borrows(cq, usage)
        for victim, reason in victims:
            victim_path = victim.cq.node.path() if victim.cq is not None else f"/{victim.cq_name}"
            budgeted = state.protection.charge(victim, reason, borrows)
            destroyed = victim.seconds_at_risk(state.now) * victim.accelerators(
                state.config.accelerator_resources
            )
            state.evict(victim)
            self.preemptions.append(
                Preemption(
                    workload=victim.key,
                    cluster_queue=victim.cq_name,
                    cluster=victim.cluster,
                    preemptor=wi.key,
                    preemptor_cluster_queue=cq.name,
                    reason=reason,  # type: ignore[arg-type]
                    message=(
                        f"Preempted to accommodate a workload ({wi.key}) due to "
                        f"{_HUMAN_REASON[reason]}; preemptor path: {preemptor_path}; "
                        f"preemptee path: {victim_path}"
                    ),
                    preemptor_path=preemptor_path,
                    victim_path=victim_path,
                    work_destroyed=destroyed,
                    budgeted=budgeted,
                )
            )


def _pod_set_assignments(
    wi: WorkloadInfo, pod_set_flavors: list[dict[str, str]], placement: GangPlacement
) -> tuple[PodSetAssignment, ...]:
    result = []
    for index, ps in enumerate(wi.pod_sets):
        flavors = pod_set_flavors[index]
        placed = placement.pod_sets[index]
        result.append(
            PodSetAssignment(
                name=ps.name,
                count=ps.count,
                flavors={r: flavors[r] for r in sorted(flavors)},
                resource_usage=dict(ps.sorted_totals),
                placement=tuple([(node.name, pods) for node, pods in placed.nodes]),
                islands=placed.islands,
            )
        )
    return tuple(result)


def _borrowed(cq: CQState, usage: dict[FlavorResource, int]) -> dict[FlavorResource, int]:
    """Per flavor-resource, how far the ClusterQueue's usage now is above its nominal quota."""
    borrowed = {}
    node = cq.node
    for fr in sorted(usage):
        quota = node.quotas.get(fr)
        nominal = quota.nominal if quota is not None else 0
        above = node.usage.get(fr, 0) - nominal
        if above > 0:
            borrowed[fr] = above
    return borrowed
