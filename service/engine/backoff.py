"""Readiness timeout (Kueue ``waitForPodsReady``): requeue with exponential backoff.

A gang whose pods are not all Ready within the timeout is evicted whole and
requeued; the n-th requeue waits ``base * 2^(n-1)`` seconds, capped at
``max``; once ``n`` exceeds the limit the workload is deactivated. Kueue adds
random jitter; we do not, so that the same inputs give the same decisions.
"""

from __future__ import annotations

from service.domain.workload import RequeueState

__all__ = ["next_requeue_state", "requeue_delay"]


def requeue_delay(count: int, base_seconds: float, max_seconds: float) -> float:
    """Seconds to wait before the ``count``-th requeue (``count`` ≥ 1)."""
    if count < 1:
        return 0.0
    # Cap the exponent first: 2**1000 is fine for ints but not for floats.
    exponent = min(count - 1, 62)
    return float(min(base_seconds * (2**exponent), max_seconds))


def next_requeue_state(
    previous: RequeueState | None,
    now: float,
    base_seconds: float,
    max_seconds: float,
    limit: int | None,
) -> tuple[RequeueState, bool]:
    """The requeue state after one more timeout, and whether to deactivate."""
    count = (previous.count if previous else 0) + 1
    if limit is not None and count > limit:
        return RequeueState(count=count, requeue_at=None), True
    return RequeueState(
        count=count, requeue_at=now + requeue_delay(count, base_seconds, max_seconds)
    ), False
