"""Choosing the flavor of one resource group of one pod set, quota and room both.

Reference: kueue ``pkg/scheduler/flavorassigner/flavorassigner.go``
(``findFlavorForPodSets``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.engine.flavorassigner.assignment import Assignment, Notes, Oracle, PreemptionPlan
from service.engine.flavorassigner.fits import can_preempt_at_all, fits_quota
from service.engine.flavorassigner.matching import (
    describe_shape,
    known_mismatch,
    never_fits_message,
)
from service.engine.flavorassigner.modes import (
    FIT,
    NO_CANDIDATES,
    NO_FIT,
    NO_MATCHING_FLAVOR,
    PREEMPT,
    RECLAIM,
    TOPOLOGY_PLACEMENT_FAILED,
    WAITING_FOR_CAPACITY,
    is_preferred,
    should_try_next,
    worse,
)
from service.engine.fragmentation import fragmentation_of
from service.engine.packing import GangPlacement, PodSetRequest, place_gang, pristine_fits
from service.engine.quota import FlavorResource
from service.engine.state import CQState, CycleState
from service.engine.types import Fragmentation
from service.engine.workload_info import (
    PodSetInfo,
    WorkloadInfo,
)

__all__ = ["GroupSearch"]


@dataclass(slots=True)
class _Trial:
    """One flavor tried for one resource group of one pod set."""

    mode: tuple[int, int]
    placement: GangPlacement | None = None
    plan: PreemptionPlan | None = None
    need: set[FlavorResource] = field(default_factory=set)
    #: Quota fits and the free total would, but no island has room now.
    fragmentation: Fragmentation | None = None


@dataclass(slots=True)
class GroupSearch:
    """Choosing the flavor of one resource group of one pod set."""

    state: CycleState
    wi: WorkloadInfo
    cq: CQState
    index: int
    resources: list[str]
    chosen: dict[str, str]
    result: Assignment
    #: Physical placement is tried once the pod set's last group has a flavor.
    place: bool
    oracle: Oracle | None
    notes: Notes = field(default_factory=Notes)

    @property
    def ps(self) -> PodSetInfo:
        return self.wi.pod_sets[self.index]

    def quota_mode(self, name: str) -> _Trial:
        trial = _Trial((FIT, 0))
        totals = self.ps.totals
        for resource in self.resources:
            fr = (name, resource)
            value = self.result.usage.get(fr, 0) + totals[resource]
            fmode, borrow, reason, note = fits_quota(self.state, self.cq, fr, value)
            if note is not None:
                self.notes.add(note, reason)
            trial.mode = worse(trial.mode, (fmode, borrow))
            if fmode in (PREEMPT, NO_FIT):
                trial.need.add(fr)
            if fmode == NO_FIT:
                break
        return trial

    def physical_mode(self, name: str, trial: _Trial) -> None:
        """Refine a quota mode with room in the fleet (and a preemption plan)."""
        state, ps = self.state, self.ps
        if trial.mode[0] == FIT:
            flavors_now = {**self.chosen, **dict.fromkeys(self.resources, name)}
            trial.placement = _try_place(state, self.wi, self.index, flavors_now)
            if trial.placement is None:
                request = state.pod_set_request(self.wi, self.index, flavors_now)
                if pristine_fits(state.inventory, [request], state.pristine_cache):
                    trial.fragmentation = fragmentation_of(request, name)
                    words = (
                        f"no cluster has room now for {ps.count} pod(s) of "
                        f"{describe_shape(ps)} in flavor {name}"
                    )
                    if trial.fragmentation is not None:
                        words = f"{words}: {trial.fragmentation.message()}"
                    self.notes.add(words, WAITING_FOR_CAPACITY)
                    trial.mode = (PREEMPT, trial.mode[1])
                    trial.need |= {(name, r) for r in self.resources}
                else:
                    self.notes.add(never_fits_message(ps, name), TOPOLOGY_PLACEMENT_FAILED)
                    trial.mode = (NO_FIT, trial.mode[1])
        if trial.mode[0] != PREEMPT:
            return
        if not can_preempt_at_all(self.cq):
            trial.mode = (NO_CANDIDATES, trial.mode[1])
            return
        if self.oracle is None or len(self.wi.pod_sets) != 1:
            return
        if not self.state.preemptible_in_tree.get(self.cq.root):
            # What any search would find: nobody (see ``Oracle``).
            trial.mode = (NO_CANDIDATES, trial.mode[1])
            return
        flavors_now = {**self.chosen, **dict.fromkeys(self.resources, name)}
        attempt = Assignment(
            pod_set_flavors=[flavors_now],
            usage=_usage_with(self.result.usage, ps, flavors_now),
            frs_need_preemption=trial.need,
        )
        trial.plan = self.oracle(self.wi, attempt)
        if trial.plan is None:
            trial.mode = (NO_CANDIDATES, trial.mode[1])
        elif all(getattr(v, "cq", None) is not self.cq for v, _ in trial.plan.victims):
            trial.mode = (RECLAIM, trial.plan.borrow)
        else:
            trial.mode = (PREEMPT, trial.plan.borrow)

    def choose(self, flavor_names: tuple[str, ...]) -> tuple[str | None, _Trial]:
        fungibility = self.cq.spec.flavor_fungibility
        best = _Trial((NO_FIT, 1 << 30))
        best_flavor: str | None = None
        for name in flavor_names:
            mismatch = known_mismatch(self.state, name, self.ps)
            if mismatch is not None:
                self.notes.add(mismatch, NO_MATCHING_FLAVOR)
                continue
            trial = self.quota_mode(name)
            if self.place and trial.mode[0] != NO_FIT:
                self.physical_mode(name, trial)
            if not should_try_next(trial.mode, fungibility):
                return name, trial
            if is_preferred(trial.mode, best.mode, fungibility):
                best, best_flavor = trial, name
        return best_flavor, best


def _usage_with(
    usage: dict[FlavorResource, int], ps: PodSetInfo, flavors: dict[str, str]
) -> dict[FlavorResource, int]:
    result = dict(usage)
    for resource, amount in ps.totals.items():
        fr = (flavors[resource], resource)
        result[fr] = result.get(fr, 0) + amount
    return result


def _try_place(
    state: CycleState, wi: WorkloadInfo, index: int, flavors: dict[str, str]
) -> GangPlacement | None:
    request: PodSetRequest = state.pod_set_request(wi, index, flavors)
    return place_gang(state.inventory, [request])
