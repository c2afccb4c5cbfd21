"""A Volcano-like member: the scheduler (:mod:`.session`, with :mod:`.placement` for
where a gang fits), the Job controller (:mod:`.job`) and the queue controller
(:mod:`.queue`), over the PodGroup and Queue vocabulary of :mod:`.podgroup`.
Started instead of the Kueue controller on a member whose backend is
``volcano``; see ``docs/volcano.md``."""

from __future__ import annotations

from sim.kubesim.controllers.volcano.job import VolcanoJobController, podgroup_name
from sim.kubesim.controllers.volcano.queue import VolcanoQueueController
from sim.kubesim.controllers.volcano.session import VolcanoScheduler

__all__ = [
    "VolcanoJobController",
    "VolcanoQueueController",
    "VolcanoScheduler",
    "podgroup_name",
]
