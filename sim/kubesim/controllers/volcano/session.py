"""The Volcano-like scheduler: one session over every PodGroup, as ``vc-scheduler`` runs
its actions ``enqueue, allocate`` each period.

* **enqueue** — a ``Pending`` group enters ``Inqueue`` when its queue is open and the
  queue's holdings plus the group's ``minResources`` stay within ``capability``
  (the capacity / proportion plugins' ``JobEnqueueable``); otherwise it stays
  ``Pending`` with ``Unschedulable``/``NotInqueueable`` and an ``Uninqueueable`` event.
* **allocate** — an ``Inqueue`` group's pods (``schedulerName: volcano``, annotated
  ``scheduling.k8s.io/group-name``) are bound only when ``minMember`` of them fit at
  once (gang), inside one tier-1 domain when ``networkTopology`` is hard at tier 1;
  else ``Unschedulable``/``NotEnoughResources`` (or ``NotEnoughPods``), a Warning
  event ``Unschedulable``, and no pod of the group is bound.
* **status** — ``Inqueue`` → ``Running`` once ``minMember`` pods are placed, →
  ``Completed`` once they have all ended (``Unknown`` while part of a gang runs
  and the rest cannot be placed); ``running``/``succeeded``/``failed``
  counted; each Queue's ``state`` and counts of groups per phase written back.

Not simulated: preemption and reclaim (the central service decides those),
priority classes, overcommit, ``minTaskMember``, sub-groups and tiers above 1
(a group allowed beyond tier 1 may use the whole cluster).
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable
from typing import Any

from sim.kubesim.controllers.base import Reconciler, pod_requests, set_condition
from sim.kubesim.controllers.scheduler import bound_and_live, strip_empty_reasons
from sim.kubesim.controllers.volcano.placement import (
    Domain,
    NodeRoom,
    Placement,
    domains,
    place_gang,
)
from sim.kubesim.controllers.volcano.podgroup import (
    HOLDING,
    HYPERNODES,
    PODGROUPS,
    QUEUES,
    READY_REASON,
    add,
    drop_condition,
    fits_within,
    group_of,
    min_resources,
    set_pg_condition,
)
from sim.kubesim.quantity import resource_quantity
from sim.kubesim.store import Event, clone

__all__ = ["VolcanoScheduler"]

Obj = dict[str, Any]
SESSION = ("session",)
#: Events to record about a group once its status is written: (type, reason, message).
Messages = list[tuple[str, str, str]]
_TERMINAL = ("Succeeded", "Failed")
_WATCHED = ("pods", "nodes", PODGROUPS, QUEUES, HYPERNODES)
#: Where the island label comes from when the fleet names no topology.
DEFAULT_ISLAND_LABEL = "example.com/fabric-block"


def _phase(obj: Obj) -> str:
    return str((obj.get("status") or {}).get("phase") or "Pending")


def _live(pod: Obj) -> bool:
    return _phase(pod) not in _TERMINAL and not pod["metadata"].get("deletionTimestamp")


def _key(obj: Obj) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _hard_tier_one(group: Obj) -> bool:
    topology = (group.get("spec") or {}).get("networkTopology") or {}
    return topology.get("mode", "hard") == "hard" and topology.get("highestTierAllowed") == 1


def _order(group: Obj) -> tuple[str, str, str]:
    metadata = group["metadata"]
    return metadata.get("creationTimestamp", ""), metadata.get("namespace", ""), metadata["name"]


class VolcanoScheduler(Reconciler):
    """``volcano``: enqueues PodGroups against their Queues and binds their gangs."""

    name = "volcano"
    manager = "vc-scheduler"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.island_labels = self._island_labels()
        self.enqueue(SESSION)

    def _island_labels(self) -> tuple[str, ...]:
        fleet = self.cluster.fleet
        levels = [t.levels[0] for t in fleet.topologies if t.levels] if fleet else []
        return tuple(dict.fromkeys([*levels, DEFAULT_ISLAND_LABEL]))

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        if resource_key in _WATCHED:
            yield SESSION

    def reconcile(self, key: Hashable) -> None:
        if key == SESSION:
            Session(self).run()


class Session:
    """One scheduling session: a snapshot of nodes, pods, groups and queues, then decisions."""

    def __init__(self, scheduler: VolcanoScheduler) -> None:
        self.s = scheduler
        self.uid = str(uuid.uuid4())
        self.pods = scheduler.items("pods")
        self.nodes = scheduler.items("nodes")
        self.queues = {q["metadata"]["name"]: q for q in scheduler.items(QUEUES)}
        self.groups = sorted(scheduler.items(PODGROUPS), key=_order)
        self.members: dict[tuple[str, str], list[Obj]] = defaultdict(list)
        for pod in self.pods:
            group = group_of(pod)
            if group is not None:
                self.members[(pod["metadata"].get("namespace", ""), group)].append(pod)
        self.rooms = self._rooms()
        self.held: dict[str, dict[str, int]] = defaultdict(dict)
        self.domains: list[Domain] | None = None
        #: Pods bound in this session, per group (the snapshot still shows them unbound).
        self.just_bound: Counter[tuple[str, str]] = Counter()
        #: Groups found unschedulable in this session (Volcano: the condition's transitionID).
        self.unschedulable: set[tuple[str, str]] = set()

    # -- snapshot ----------------------------------------------------------------------

    def _rooms(self) -> list[NodeRoom]:
        used: dict[str, Counter[str]] = defaultdict(Counter)
        for pod in self.pods:
            if bound_and_live(pod):
                node = pod["spec"]["nodeName"]
                used[node].update(pod_requests(pod["spec"]))
                used[node]["pods"] += 1
        rooms = []
        for node in self.nodes:
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            free = pod_requests({"containers": [{"resources": {"requests": allocatable}}]})
            free.setdefault("pods", 110)
            taken = used[node["metadata"]["name"]]
            rooms.append(NodeRoom(node, {n: a - taken.get(n, 0) for n, a in free.items()}))
        return rooms

    def _tier_one(self) -> list[Domain]:
        if self.domains is None:
            hypernodes = self.s.items(HYPERNODES)
            self.domains = domains(hypernodes, self.nodes, self.s.island_labels)
        return self.domains

    def _holding(self, group: Obj) -> dict[str, int]:
        """What a group holds of its queue: ``minResources``, or more once its pods run."""
        held = min_resources(group)
        running: dict[str, int] = {}
        for pod in self.members[_key(group)]:
            if bound_and_live(pod):
                add(running, pod_requests(pod["spec"]))
        return {n: max(held.get(n, 0), running.get(n, 0)) for n in {*held, *running}}

    # -- the session -------------------------------------------------------------------

    def run(self) -> None:
        for group in self.groups:
            if _phase(group) in HOLDING:
                add(self.held[self._queue_name(group)], self._holding(group))
        for group in self.groups:
            self._schedule(group)
        for queue in self.queues.values():
            self._queue_status(queue)

    def _queue_name(self, group: Obj) -> str:
        return str((group.get("spec") or {}).get("queue") or "default")

    def _schedule(self, group: Obj) -> None:
        status = clone(group.get("status") or {})
        status.setdefault("phase", "Pending")
        messages: Messages = []
        if status["phase"] == "Pending":
            self._enqueue(group, status, messages)
        if status["phase"] in HOLDING:
            self._allocate(group, status, messages)
        self._count(group, status)
        self._write(group, status, messages)

    def _enqueue(self, group: Obj, status: Obj, messages: Messages) -> None:
        name = self._queue_name(group)
        queue = self.queues.get(name)
        state = ((queue or {}).get("status") or {}).get("state") or "Open"
        if queue is None or state != "Open":
            why = f"queue {name} does not exist" if queue is None else f"queue {name} is {state}"
            self._not_inqueueable(status, messages, why)
            return
        wanted = min_resources(group)
        after = dict(self.held[name])
        add(after, wanted)
        capability = min_resources({"spec": {"minResources": queue["spec"].get("capability")}})
        over = fits_within(after, capability)
        if over:
            why = f"queue {name} capability insufficient: {', '.join(over)}"
            self._not_inqueueable(status, messages, why)
            return
        self.held[name] = after
        status["phase"] = "Inqueue"
        drop_condition(status, ("Unschedulable",))

    def _not_inqueueable(self, status: Obj, messages: Messages, why: str) -> None:
        if set_pg_condition(status, "Unschedulable", "True", "NotInqueueable", why, self.uid):
            messages.append(("Warning", "Uninqueueable", why))

    def _allocate(self, group: Obj, status: Obj, messages: Messages) -> None:
        members = self.members[_key(group)]
        live = [p for p in members if _live(p)]
        placed = [p for p in live if p["spec"].get("nodeName")]
        waiting = sorted((p for p in live if not p["spec"].get("nodeName")), key=_key)
        done = sum(1 for p in members if _phase(p) == "Succeeded")
        need = max(0, int(group["spec"].get("minMember", 1)) - len(placed) - done)
        if not waiting:
            return
        if len(waiting) < need:
            minimum = group["spec"].get("minMember", 1)
            detail = f"pod group is not ready, {len(waiting)} Pending, {minimum} minAvailable"
            why = self._gang_message(group, len(waiting), detail)
            self._unschedulable(group, status, messages, "NotEnoughPods", why)
            return
        within = self._within(group, placed)
        batch = waiting[:need] if need else waiting[:1]  # the gang, then one at a time
        placement = place_gang(batch, self.rooms, within)
        if not placement.complete:
            self._failed(group, status, messages, waiting, need, placement)
            return
        self.just_bound[_key(group)] += self._bind_all(waiting, placement)
        drop_condition(status, ("Unschedulable",))
        if set_pg_condition(status, "Scheduled", "True", READY_REASON, "", self.uid):
            messages.append(("Normal", "Scheduled", READY_REASON))
        status["phase"] = "Running"

    def _within(self, group: Obj, placed: list[Obj]) -> list[Domain] | None:
        if not _hard_tier_one(group):
            return None
        candidates = self._tier_one()
        if placed:  # the gang's domain is chosen: the rest of it joins there
            nodes = {p["spec"]["nodeName"] for p in placed}
            candidates = [d for d in candidates if nodes <= d.nodes]
        return candidates

    def _failed(
        self,
        group: Obj,
        status: Obj,
        messages: Messages,
        waiting: list[Obj],
        need: int,
        placement: Placement,
    ) -> None:
        parts = ", ".join(
            f"{count} {reason}" for reason, count in sorted(placement.reasons.items())
        )
        fit = f"0/{len(self.nodes)} nodes are unavailable: {parts}."
        if _hard_tier_one(group):
            fit = f"no tier-1 hypernode has room for {need} pods; {fit}"
        why = self._gang_message(group, len(waiting), fit)
        self._unschedulable(group, status, messages, "NotEnoughResources", why)
        for pod in waiting:
            self._pod_unschedulable(pod, fit)

    def _gang_message(self, group: Obj, pending: int, detail: str) -> str:
        """The gang plugin's wording: pending tasks over all the group's tasks, then why."""
        total = len(self.members[_key(group)])
        return f"{pending}/{total} tasks in gang unschedulable: {detail}"

    def _unschedulable(
        self, group: Obj, status: Obj, messages: Messages, reason: str, why: str
    ) -> None:
        self.unschedulable.add(_key(group))
        if set_pg_condition(status, "Unschedulable", "True", reason, why, self.uid):
            messages.append(("Warning", "Unschedulable", why))

    # -- writes ------------------------------------------------------------------------

    def _bind_all(self, waiting: list[Obj], placement: Placement) -> int:
        rooms = {r.name: r for r in self.rooms}
        bound = 0
        for pod in waiting:
            node = placement.bound.get(pod["metadata"]["name"])
            if node is None:
                continue
            bound += 1
            room = rooms[node]
            for name, amount in pod_requests(pod["spec"]).items():
                room.free[name] = room.free.get(name, 0) - amount
            room.free["pods"] = room.free.get("pods", 0) - 1
            self._bind(pod, node)
        return bound

    def _bind(self, pod: Obj, node: str) -> None:
        bound = self.s.mutate("pods", pod, lambda p: p["spec"].__setitem__("nodeName", node))

        def scheduled(p: Obj) -> None:
            status = p.setdefault("status", {})
            set_condition(status, "PodScheduled", "True", "", "", probe_times=True)
            strip_empty_reasons(status)

        self.s.mutate("pods", bound, scheduled, status=True)
        namespace, name = _key(pod)
        self.s.events.emit(
            bound, "Pod", "Scheduled", f"Successfully assigned {namespace}/{name} to {node}"
        )

    def _pod_unschedulable(self, pod: Obj, message: str) -> None:
        current = next(
            (
                c
                for c in (pod.get("status") or {}).get("conditions") or ()
                if c.get("type") == "PodScheduled"
            ),
            None,
        )
        if current and current.get("message") == message:
            return
        self.s.mutate(
            "pods",
            pod,
            lambda p: set_condition(
                p.setdefault("status", {}),
                "PodScheduled",
                "False",
                "Unschedulable",
                message,
                probe_times=True,
            ),
            status=True,
        )

    def _count(self, group: Obj, status: Obj) -> None:
        """Counts and phase as Volcano's ``jobStatus``: ``Unknown`` when some pods run and
        the rest were found unschedulable this session; else ``Running`` while
        ``minMember`` pods are placed or ended, ``Completed`` once every placed pod
        ended; short of that, back to ``Pending`` unless ``Inqueue``."""
        members = self.members[_key(group)]
        phases = Counter(_phase(p) for p in members if not p["metadata"].get("deletionTimestamp"))
        for field, phase in (
            ("running", "Running"),
            ("succeeded", "Succeeded"),
            ("failed", "Failed"),
        ):
            if phases[phase]:
                status[field] = phases[phase]
            else:
                status.pop(field, None)
        if status["phase"] == "Completed":
            return  # kept: its pods' removal must not send it back to the queue
        if phases["Running"] and _key(group) in self.unschedulable:
            status["phase"] = "Unknown"  # part of it runs, the rest did not fit this session
            return
        placed = sum(1 for p in members if _live(p) and p["spec"].get("nodeName"))
        ended = phases["Succeeded"] + phases["Failed"]
        allocated = placed + self.just_bound.get(_key(group), 0) + ended
        if allocated >= int(group["spec"].get("minMember", 1)):
            status["phase"] = "Completed" if ended == allocated else "Running"
        elif status["phase"] != "Inqueue":
            status["phase"] = "Pending"

    def _write(self, group: Obj, status: Obj, messages: Messages) -> None:
        if status == (group.get("status") or {}):
            return
        updated = self.s.mutate(PODGROUPS, group, lambda g: g.__setitem__("status", status))
        for type_, reason, message in messages:
            self.s.events.emit(updated, "PodGroup", reason, message, type_)

    def _queue_status(self, queue: Obj) -> None:
        name = queue["metadata"]["name"]
        phases = Counter(_phase(g) for g in self.groups if self._queue_name(g) == name)
        status = clone(queue.get("status") or {})
        status.setdefault("state", "Open")
        for field, phase in (
            ("pending", "Pending"),
            ("inqueue", "Inqueue"),
            ("running", "Running"),
            ("completed", "Completed"),
        ):
            status[field] = phases[phase]
        held = self.held.get(name) or {}
        status["allocated"] = {n: resource_quantity(n, a) for n, a in sorted(held.items()) if a}
        if status != (queue.get("status") or {}):
            self.s.mutate(QUEUES, queue, lambda q: q.__setitem__("status", status), status=True)
