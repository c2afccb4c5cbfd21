"""Quota checks: the mode of one flavor-resource, and of one flavor for a gang alone.

Reference: kueue ``pkg/scheduler/flavorassigner/flavorassigner.go``
(``fitsResourceQuota``).
"""

from __future__ import annotations

from service.engine.flavorassigner.assignment import QuotaNote
from service.engine.flavorassigner.modes import (
    EXCEEDS_MAX_QUOTA,
    FIT,
    NO_FIT,
    PREEMPT,
    WAITING_FOR_QUOTA,
)
from service.engine.quota import FlavorResource, QuotaNode
from service.engine.state import CQState, CycleState
from service.engine.workload_info import PlannedFlavor

__all__ = ["can_preempt_at_all", "fits_quota", "flavor_mode"]


def _quota_check(cq: CQState, fr: FlavorResource, value: int) -> tuple[int, int, int]:
    """``(mode, borrow, room)`` for ``value`` of one flavor-resource.

    ``borrow`` is -1 when ``value`` exceeds the most the ClusterQueue could ever
    use (``room`` is then that maximum); otherwise ``room`` is what is available now.
    """
    node = cq.node
    flat = node.flat_root(fr)
    if flat is not None:
        return _flat_quota_check(cq, flat, fr, value)
    maximum = node.potential_available(fr)
    if value > maximum:
        return NO_FIT, -1, maximum
    available = node.available(fr)
    if value <= available:
        if node.parent is None or node.usage.get(fr, 0) + value <= node.subtree_quota.get(fr, 0):
            return FIT, 0, available
        return FIT, node.borrowing_level(fr, value)[0], available
    borrow, may_reclaim = node.borrowing_level(fr, value)
    return _short(cq, fr, value, borrow, may_reclaim), borrow, available


def _short(cq: CQState, fr: FlavorResource, value: int, borrow: int, may_reclaim: bool) -> int:
    """The mode of a flavor-resource without enough quota available: preemption may help?"""
    if may_reclaim or cq.preempts_while_borrowing:
        return PREEMPT
    quota = cq.node.quotas.get(fr)
    nominal = quota.nominal if quota is not None else 0
    return PREEMPT if nominal >= value else NO_FIT


def _flat_quota_check(
    cq: CQState, root: QuotaNode, fr: FlavorResource, value: int
) -> tuple[int, int, int]:
    """``_quota_check`` when no node up to ``root`` limits borrowing or lending of ``fr``.

    Then no node keeps local quota (its local available is ``max(0, -usage)``)
    and the root's numbers give both the maximum and what is available now;
    this is ``QuotaNode.borrowing_level`` with that arithmetic inlined.
    """
    maximum = root.subtree_quota.get(fr, 0)
    if value > maximum:
        return NO_FIT, -1, maximum
    available = maximum - root.usage.get(fr, 0)
    node = cq.node
    if node.parent is None:
        borrow, may_reclaim = 0, False
    else:
        used = node.usage.get(fr, 0)
        if used + value <= node.subtree_quota.get(fr, 0):
            borrow, may_reclaim = 0, True
        else:
            borrow, may_reclaim = _flat_level(node, fr, value - max(0, -used))
    if value <= available:
        return FIT, borrow, available
    return _short(cq, fr, value, borrow, may_reclaim), borrow, available


def _flat_level(node: QuotaNode, fr: FlavorResource, remaining: int) -> tuple[int, bool]:
    """Height of the lowest ancestor whose subtree fits ``remaining`` more, flat quota."""
    ancestor = node
    for ancestor in node.lineage:
        used = ancestor.usage.get(fr, 0)
        if used + remaining <= ancestor.subtree_quota.get(fr, 0):
            return ancestor.height, ancestor.parent is not None
        remaining -= max(0, -used)
    return ancestor.height, ancestor.parent is not None


def fits_quota(
    state: CycleState, cq: CQState, fr: FlavorResource, value: int
) -> tuple[int, int, str, QuotaNote | None]:
    """``(mode, borrow, reason, note)`` for ``value`` of one flavor-resource."""
    mode, borrow, room = _quota_check(cq, fr, value)
    if borrow < 0:
        return NO_FIT, 0, EXCEEDS_MAX_QUOTA, (fr, value, room)
    if mode == FIT:
        return FIT, borrow, "", None
    return mode, borrow, WAITING_FOR_QUOTA, (fr, value - room, None)


def flavor_mode(cq: CQState, frs: PlannedFlavor) -> tuple[int, int]:
    """The ``(mode, borrow)`` of one flavor for a gang alone (``GroupSearch.quota_mode``).

    Where a flavor-resource has a flat root this is ``_flat_quota_check``
    inlined (it runs for nearly every head): the answer is most often that
    the gang fits within the ClusterQueue's own quota, and nothing is combined.
    """
    mode, borrow = FIT, 0
    node = cq.node
    parent = node.parent
    for fr, value, root in frs:
        if root is None:
            fmode, fborrow, _ = _quota_check(cq, fr, value)
        else:
            maximum = root.subtree_quota.get(fr, 0)
            if value > maximum:
                fmode, fborrow = NO_FIT, -1
            else:
                available = maximum - root.usage.get(fr, 0)
                if parent is None:
                    fborrow, may_reclaim = 0, False
                else:
                    used = node.usage.get(fr, 0)
                    if used + value <= node.subtree_quota.get(fr, 0):
                        if value <= available:
                            continue  # fits, within the ClusterQueue's own quota
                        fborrow, may_reclaim = 0, True
                    else:
                        fborrow, may_reclaim = _flat_level(node, fr, value - max(0, -used))
                short = value > available
                fmode = _short(cq, fr, value, fborrow, may_reclaim) if short else FIT
        mode = min(mode, fmode)
        borrow = max(borrow, fborrow)
        if fmode == NO_FIT:
            break
    return mode, borrow


def can_preempt_at_all(cq: CQState) -> bool:
    preemption = cq.spec.preemption
    return preemption.within_cluster_queue != "Never" or (
        cq.node.parent is not None and preemption.reclaim_within_cohort != "Never"
    )
