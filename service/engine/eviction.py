"""Evictions that do not depend on pending work: stopped queues, PodsReady timeouts.

They come first in a cycle, so the capacity they free is there for admission.
A workload whose pods missed the readiness timeout is requeued with backoff,
or deactivated after too many requeues.
"""

from __future__ import annotations

from service.engine.backoff import next_requeue_state
from service.engine.decisions import Decisions
from service.engine.state import CycleState
from service.engine.workload_info import AdmittedInfo

__all__ = ["evict_stopped_and_unready"]


def evict_stopped_and_unready(state: CycleState, decisions: Decisions) -> None:
    """Evict what runs in a stopped (HoldAndDrain) queue or missed its PodsReady timeout."""
    ready = state.config.wait_for_pods_ready
    for info in sorted(state.admitted.values(), key=lambda a: a.key):
        cq = info.cq
        lq = state.local_queues.get(info.lq)
        if cq is not None and cq.spec.stop_policy == "HoldAndDrain":
            decisions.evict(info, "ClusterQueueStopped", f"The ClusterQueue {cq.name} is stopped")
        elif lq is not None and lq.stop_policy == "HoldAndDrain":
            decisions.evict(info, "LocalQueueStopped", f"The LocalQueue {lq.key} is stopped")
        elif _ready_timed_out(state, info):
            requeue, deactivate = next_requeue_state(
                info.wl.requeue_state,
                state.now,
                ready.backoff_base_seconds,
                ready.backoff_max_seconds,
                ready.backoff_limit_count,
            )
            message = f"Exceeded the PodsReady timeout of {ready.timeout_seconds:g}s; " + (
                "deactivated after too many requeues"
                if deactivate
                else f"requeued, retry at {requeue.requeue_at:g}"
            )
            decisions.evict(info, "PodsReadyTimeout", message, requeue, deactivate)


def _ready_timed_out(state: CycleState, info: AdmittedInfo) -> bool:
    ready = state.config.wait_for_pods_ready
    return (
        ready.enable
        and info.pods_ready is False
        and state.now - info.admitted_at >= ready.timeout_seconds
    )
