"""An island holds one workload class at a time: training or inference.

A ClusterQueue serves one class (``service.engine.queueing``); islands are
kept apart too, so that serving pods never sit in an island a training gang
needs whole, and a training gang never lands beside latency-bound serving
(kueue#1603: one quota, isolation that holds). An island is closed to a class

* statically, when its nodes are labelled ``quartermaster.dev/workload-class``
  with the other class;
* dynamically, while it holds pods of admitted gangs of the other class —
  an accelerator island only: islands of CPU-only nodes (often a whole
  cluster's worth, with no fabric) stay shared.

A ClusterQueue labelled ``quartermaster.dev/mixed-islands: "true"`` lifts
both for its own workloads (docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from service.domain.manifests import WORKLOAD_CLASS_LABEL
from service.engine.placement import Island

__all__ = ["closed_statically", "open_now", "other_class_held"]


def closed_statically(island: Island, workload_class: str) -> bool:
    """Whether the island's nodes are labelled for the other class."""
    labelled = island.labels.get(WORKLOAD_CLASS_LABEL)
    return labelled is not None and labelled != workload_class


def other_class_held(island: Island, workload_class: str) -> bool:
    """Whether the island (with accelerators) holds pods of another class now."""
    if island.primary is None:
        return False
    return any(pods > 0 for c, pods in island.held.items() if c != workload_class)


def open_now(eligible: Mapping[int, Island], workload_class: str) -> Mapping[int, Island]:
    """``eligible`` without the islands holding the other class now; the same
    mapping when none does (its identity keys caches)."""
    if not any(other_class_held(i, workload_class) for i in eligible.values()):
        return eligible
    return {s: i for s, i in eligible.items() if not other_class_held(i, workload_class)}
