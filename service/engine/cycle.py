"""One admission cycle: evictions, queueing checks, ordering, admission, why-not.

The cycle differs from Kueue's in one deliberate way: there is no
one-head-per-ClusterQueue ceiling (kueue#14477). A ClusterQueue whose head is
admitted immediately nominates its next workload, and the cycle goes on until
no head is left, so one cycle admits everything that fits, in order.

Most gangs that cannot fit are rejected without a flavor search: per
ClusterQueue the cycle remembers which gangs failed (shape, priority, time,
size); a later gang of the same shape that is at least as big, no higher in
priority and no older cannot fit either, because within a cycle free quota and
capacity only shrink — until something is evicted, which resets the memory.
When nothing in the ClusterQueue's quota tree could be preempted at all (only
workloads admitted before the cycle can), priority and age do not matter.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator

from service.domain.quota import LocalQueue
from service.domain.workload import Admission, PodSetAssignment, RequeueState, Workload
from service.engine.backoff import next_requeue_state
from service.engine.feasibility import Verdict, never_fits
from service.engine.flavorassigner import (
    FIT,
    NO_FIT,
    PREEMPT,
    RECLAIM,
    Assignment,
    admit_simply,
    assign_flavors,
    quota_mode_only,
)
from service.engine.ordering import ClusterQueueQueue, FairSelector, PlainSelector
from service.engine.packing import GangPlacement
from service.engine.preemption import find_preemption_plan
from service.engine.quota import FlavorResource
from service.engine.state import CQState, CycleState
from service.engine.types import (
    AdmissionDecision,
    CycleResult,
    Eviction,
    EvictionReason,
    PendingReason,
    Preemption,
    Snapshot,
)
from service.engine.workload_info import AdmittedInfo, WorkloadInfo, selector_key

__all__ = ["run_cycle"]

_HUMAN_REASON = {
    "InClusterQueue": "prioritization in the ClusterQueue",
    "InCohortReclamation": "reclamation within the cohort",
    "InCohortFairSharing": "fair sharing within the cohort",
    "InCohortReclaimWhileBorrowing": "reclamation within the cohort while borrowing",
}

#: Why a queue holds a workload back before trying it: told before any verdict.
_HELD_REASONS = frozenset(
    {"ClusterQueueStopped", "LocalQueueStopped", "RequeueBackoff", "NoMatchingCluster"}
)

#: How many failures each ClusterQueue remembers for fast rejection.
_FAILURE_MEMORY = 16


class _Failure:
    __slots__ = (
        "_assignment",
        "epoch",
        "message",
        "no_victims",
        "priority",
        "reason",
        "signature",
        "time",
        "totals",
    )

    def __init__(
        self, wi: WorkloadInfo, reason: str, assignment: Assignment, epoch: int, no_victims: bool
    ) -> None:
        self.signature = wi.signature()
        self.priority = wi.priority
        self.time = wi.time
        self.totals = wi.resources
        self.reason = reason
        self._assignment: Assignment | None = assignment
        #: ``None`` until :meth:`text` renders it.
        self.message: str | None = None
        self.epoch = epoch
        #: Nothing in the quota tree could be preempted: priority and age cannot help.
        self.no_victims = no_victims

    def text(self) -> str:
        """The why-not message, rendered once, when the result is built."""
        message = self.message
        if message is None:
            assert self._assignment is not None
            message = self.message = self._assignment.message() or "insufficient quota"
            self._assignment = None
        return message

    def covers(self, wi: WorkloadInfo, epoch: int) -> bool:
        """Whether ``wi``, of this failure's signature, cannot fit either (see the module)."""
        if self.epoch != epoch:
            return False
        if not self.no_victims and (wi.priority > self.priority or wi.time < self.time):
            return False
        totals = wi.resources
        if totals is self.totals:  # the same gang shape
            return True
        return all(totals.get(r, 0) >= a for r, a in self.totals.items())


#: Why a workload waits: ``(reason, message or the failure that explains it, ClusterQueue,
#: LocalQueue)``, or the failure itself (of the workload's own queues).
_Entry = tuple[str, str | _Failure, str | None, str] | _Failure


class _Cycle:
    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.state = CycleState(snapshot, now)
        self.now = now
        self.admissions: list[AdmissionDecision] = []
        self.preemptions: list[Preemption] = []
        self.evictions: list[Eviction] = []
        #: Workloads that cannot queue at all: key -> (reason, message, None, LocalQueue).
        #: A queued (or held) workload keeps why it waits on itself (``WorkloadInfo.why``):
        #: such a tuple with its ClusterQueue, or the failure that explains it.
        self.pending: dict[str, _Entry] = {}
        self.queues: dict[str, ClusterQueueQueue] = {}
        self.failures: dict[str, list[_Failure]] = {}
        self.quota_usage: dict[tuple[str, int], dict[FlavorResource, int]] = {}
        self._limit = snapshot.config.max_heads_per_cluster_queue
        #: Workloads that keep their place in a ClusterQueue but may not be tried now.
        self._held: dict[str, list[WorkloadInfo]] = {}
        self._last_epoch = 0
        self._queueing_cache: dict[object, tuple[str, str, bool] | None] = {}
        #: LocalQueue key -> (that key, shared by its workloads; its ClusterQueue, if both exist).
        self._routes: dict[str, tuple[str, CQState | None]] = {}
        #: ClusterQueue -> the root of its quota tree.
        self._root_of = {name: cq.root for name, cq in self.state.cqs.items()}
        #: ``(ClusterQueue, gang shape, cluster selector)`` -> its feasibility verdict.
        self._verdicts: dict[tuple[str, object, object], Verdict | None] = {}

    # --- 1. evictions that do not depend on pending work ------------------------------------

    def evict_stopped_and_unready(self) -> None:
        state = self.state
        ready = state.config.wait_for_pods_ready
        for info in sorted(state.admitted.values(), key=lambda a: a.key):
            cq = info.cq
            lq = state.local_queues.get(info.lq)
            if cq is not None and cq.spec.stop_policy == "HoldAndDrain":
                self._evict(info, "ClusterQueueStopped", f"The ClusterQueue {cq.name} is stopped")
            elif lq is not None and lq.stop_policy == "HoldAndDrain":
                self._evict(info, "LocalQueueStopped", f"The LocalQueue {lq.key} is stopped")
            elif self._ready_timed_out(info):
                requeue, deactivate = next_requeue_state(
                    info.wl.requeue_state,
                    self.now,
                    ready.backoff_base_seconds,
                    ready.backoff_max_seconds,
                    ready.backoff_limit_count,
                )
                message = f"Exceeded the PodsReady timeout of {ready.timeout_seconds:g}s; " + (
                    "deactivated after too many requeues"
                    if deactivate
                    else f"requeued, retry at {requeue.requeue_at:g}"
                )
                self._evict(info, "PodsReadyTimeout", message, requeue, deactivate)

    def _ready_timed_out(self, info: AdmittedInfo) -> bool:
        ready = self.state.config.wait_for_pods_ready
        return (
            ready.enable
            and info.pods_ready is False
            and self.now - info.admitted_at >= ready.timeout_seconds
        )

    def _evict(
        self,
        info: AdmittedInfo,
        reason: EvictionReason,
        message: str,
        requeue: RequeueState | None = None,
        deactivated: bool = False,
    ) -> None:
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

    # --- 2. which pending workloads may queue at all ----------------------------------------

    def classify(self, pending: list[Workload]) -> None:
        """Sort the pending workloads into ClusterQueues, or give each a reason it cannot queue.

        Everything about one workload is derived in input order (reading the
        workloads in memory order); only ``seq`` waits for the arrival order.
        """
        state = self.state
        infos = [self._prepare(wl) for wl in pending]
        problems = [self._queueing_problem(wi) for wi in infos]
        keys = [wi.key for wi in infos]
        order = _arrival_order(keys, [wi.time for wi in infos])
        distinct = set(keys)
        if len(distinct) == len(keys) and distinct.isdisjoint(state.admitted):
            arrivals: Iterable[tuple[int, int]] = enumerate(order)
        else:
            arrivals = _first_arrivals(order, keys, state.admitted)
        by_lq: dict[str, list[WorkloadInfo]] = {}
        for seq, index in arrivals:
            wi = infos[index]
            wi.seq = seq
            problem = problems[index]
            if problem is None:
                queue = by_lq.get(wi.lq)
                if queue is None:
                    queue = by_lq[wi.lq] = []
                queue.append(wi)
                continue
            cq = wi.cq
            reason, message, stays_queued = problem
            if stays_queued and cq is not None:
                self._pend(wi, reason, message, cq.name)
                self._held.setdefault(cq.name, []).append(wi)
            else:
                self._pend(wi, reason, message, None)
        # A LocalQueue's workloads all go to its ClusterQueue.
        by_cq: dict[str, dict[str, list[WorkloadInfo]]] = {}
        for lq, items in by_lq.items():
            cq = items[0].cq
            assert cq is not None
            by_cq.setdefault(cq.name, {})[lq] = items
        for name in sorted(by_cq):
            self.queues[name] = ClusterQueueQueue(name, by_cq[name], state.lq_usage)

    def _prepare(self, wl: Workload) -> WorkloadInfo:
        """The workload's info, with its ClusterQueue; ``seq`` is set once arrivals are sorted."""
        state = self.state
        priority = wl.priority if wl.priority is not None else state.priority_of(wl)
        time = wl.creation_time if wl.queued_at is None else wl.queued_at  # ``ordering_time``
        wi = WorkloadInfo(wl, priority, -1, wl.key, state.gang_shape(wl), time)
        route = self._routes.get(wi.lq)
        if route is None:
            lq = state.local_queues.get(wi.lq)
            cq = state.cqs.get(lq.cluster_queue) if lq is not None else None
            route = self._routes[wi.lq] = (wi.lq, cq)
        # One string per LocalQueue: grouping and lookups by it stay in cache.
        wi.lq, wi.cq = route
        return wi

    def _queueing_problem(self, wi: WorkloadInfo) -> tuple[str, str, bool] | None:
        """``(reason, message, stays queued)`` when the workload cannot be tried now."""
        wl = wi.wl
        cq = wi.cq
        lq = self.state.local_queues.get(wi.lq)
        if not wl.active:
            return "Inactive", "The workload is deactivated", False
        if lq is None:
            return "LocalQueueNotFound", f"LocalQueue {wl.queue_name} doesn't exist", False
        if cq is None:
            return "ClusterQueueNotFound", f"ClusterQueue {lq.cluster_queue} doesn't exist", False
        requeue_at = wl.requeue_state.requeue_at if wl.requeue_state is not None else None
        if requeue_at is not None and requeue_at > self.now:
            return (
                "RequeueBackoff",
                f"Waiting for the requeue backoff to expire at {requeue_at:g}",
                True,
            )
        # The rest depends only on the queue, namespace, class and cluster selector.
        selector = wl.cluster_selector
        key = (wi.lq, wl.workload_class, None if selector is None else selector_key(selector))
        try:
            return self._queueing_cache[key]
        except KeyError:
            problem = self._queueing_cache[key] = self._queue_problem(wl, lq, cq)
            return problem

    def _queue_problem(
        self, wl: Workload, lq: LocalQueue, cq: CQState
    ) -> tuple[str, str, bool] | None:
        state = self.state
        if cq.spec.stop_policy != "None":
            return "ClusterQueueStopped", f"ClusterQueue {cq.name} is stopped", True
        if lq.stop_policy != "None":
            return "LocalQueueStopped", f"LocalQueue {lq.key} is stopped", True
        selector = cq.spec.namespace_selector
        labels = state.namespaces.get(wl.namespace, {})
        if selector is None or not selector.matches(labels):
            return (
                "NamespaceMismatch",
                "Workload namespace doesn't match ClusterQueue selector",
                False,
            )
        if wl.workload_class != cq.spec.workload_class:
            return (
                "WorkloadClassMismatch",
                f"A {wl.workload_class} workload cannot use the {cq.spec.workload_class} "
                f"ClusterQueue {cq.name}",
                False,
            )
        if wl.cluster_selector is not None and not any(
            c.cluster.schedulable and wl.cluster_selector.matches(c.cluster.labels)
            for c in state.inventory.clusters.values()
        ):
            return (
                "NoMatchingCluster",
                "No healthy, uncordoned cluster matches the cluster selector",
                True,
            )
        return None

    def _pend(self, wi: WorkloadInfo, reason: str, message: str | _Failure, cq: str | None) -> None:
        if cq is None:
            self.pending[wi.key] = (reason, message, None, wi.lq)
        else:
            wi.why = (reason, message, cq, wi.lq)

    # --- 3. the admission loop ---------------------------------------------------------------

    def _head(self, name: str) -> WorkloadInfo | None:
        """The next workload of a ClusterQueue worth trying, rejecting known misfits."""
        queue = self.queues.get(name)
        if queue is None or queue.blocked_by is not None:
            return None
        limit = self._limit
        if limit is not None and queue.attempted >= limit:
            return None
        if queue.verified is not None:
            return queue.verified
        failures = self.failures.get(name)
        while True:
            if limit is not None and queue.attempted >= limit:
                return None
            wi = queue.head()
            if wi is None:
                return None
            failure = self._known_failure(wi, failures) if failures else None
            if failure is None:
                # Only this queue's own failed attempt adds to its failure memory,
                # and that attempt moves the head on: the verdict stays valid.
                queue.verified = wi
                return wi
            queue.attempted += 1
            wi.why = failure
            queue.advance()
            if wi.cq is not None and wi.cq.strict:
                queue.blocked_by = wi
                return None

    def _known_failure(self, wi: WorkloadInfo, failures: list[_Failure]) -> _Failure | None:
        """The first remembered failure of the queue that covers ``wi``, if any."""
        signature = wi.signature()
        epoch = self.state.epoch
        for failure in failures:
            # Most failures are of other shapes: compare signatures before calling ``covers``.
            if (
                failure.signature is signature or failure.signature == signature
            ) and failure.covers(wi, epoch):
                return failure
        return None

    def _strict(self, wi: WorkloadInfo) -> bool:
        assert wi.cq is not None
        return wi.cq.strict

    def _quota_usage(self, wi: WorkloadInfo) -> tuple[Assignment, dict[FlavorResource, int]]:
        assignment = assign_flavors(self.state, wi, physical=False)
        return assignment, assignment.usage

    def _plain_key(self, name: str, wi: WorkloadInfo) -> tuple[object, ...]:
        mode = quota_mode_only(self.state, wi)
        if mode is None:
            assignment = self._quota_usage(wi)[0]
            mode = (assignment.mode, assignment.borrow)
        borrow = mode[1] if mode[0] != NO_FIT else 1 << 20
        # ``seq`` follows ordering time: ``(time, seq)`` and ``seq`` order alike.
        return (borrow, -wi.priority, wi.seq)

    def _usage_stamp(self, name: str) -> int:
        return self.state.usage_version.get(self._root_of[name], 0)

    def _nominee(self, name: str) -> tuple[WorkloadInfo, dict[FlavorResource, int]] | None:
        wi = self._head(name)
        if wi is None:
            return None
        cache_key = (name, wi.seq)
        usage = self.quota_usage.get(cache_key)
        if usage is None:
            usage = self._quota_usage(wi)[1]
            self.quota_usage[cache_key] = usage
        return wi, usage

    def run(self) -> None:
        state = self.state
        selector: PlainSelector | FairSelector
        if state.config.fair_sharing.enable:
            selector = FairSelector(state, self._nominee)
        else:
            selector = PlainSelector(self._head, self._plain_key, self._usage_stamp)
        for name in sorted(self.queues):
            selector.update(name)
        while True:
            popped = selector.pop()
            if popped is None:
                break
            name = popped
            queue = self.queues[name]
            wi = self._head(name)
            if wi is None:
                selector.update(name)
                continue
            queue.attempted += 1
            admitted = self._try_admit(wi)
            queue.advance()
            if admitted:
                queue.usage_changed(wi.lq)
            elif self._strict(wi):
                queue.blocked_by = wi
            selector.update(name)
            if admitted and state.epoch != self._last_epoch:
                # Evictions freed capacity: other ClusterQueues' heads may now fit.
                self._last_epoch = state.epoch
                for other in sorted(self.queues):
                    if other != name:
                        selector.update(other)

    def _try_admit(self, wi: WorkloadInfo) -> bool:
        state = self.state
        assert wi.cq is not None
        simple = admit_simply(state, wi)
        if simple is not None:
            self._admit(wi, *simple, [])
            return True
        assignment = assign_flavors(
            state, wi, physical=True, oracle=lambda w, a: find_preemption_plan(state, w, a)
        )
        if assignment.mode == FIT and assignment.placement is not None:
            self._admit(wi, assignment.usage, assignment.pod_set_flavors, assignment.placement, [])
            return True
        if assignment.mode in (PREEMPT, RECLAIM):
            plan = assignment.plan or find_preemption_plan(state, wi, assignment)
            if plan is not None:
                victims = []
                for victim, reason in plan.victims:
                    assert isinstance(victim, AdmittedInfo)
                    victims.append((victim, reason))
                self._admit(
                    wi, assignment.usage, assignment.pod_set_flavors, plan.placement, victims
                )
                return True
        reason = assignment.reason or "WaitingForQuota"
        memory = self.failures.setdefault(wi.cq.name, [])
        # Victims are only workloads admitted before the cycle, and they only
        # leave with an eviction (a new epoch): none now means none this epoch.
        no_victims = not state.preemptible_in_tree.get(wi.cq.root)
        failure = _Failure(wi, reason, assignment, state.epoch, no_victims)
        wi.why = failure
        memory.append(failure)
        if len(memory) > _FAILURE_MEMORY:
            del memory[0]
        return False

    def _admit(
        self,
        wi: WorkloadInfo,
        usage: dict[FlavorResource, int],
        pod_set_flavors: list[dict[str, str]],
        placement: GangPlacement,
        victims: list[tuple[AdmittedInfo, str]],
    ) -> None:
        assert wi.cq is not None
        cq = wi.cq
        if victims:
            self._preempt(wi, victims)
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

    def _preempt(self, wi: WorkloadInfo, victims: list[tuple[AdmittedInfo, str]]) -> None:
        """Evict the victims whole, each recorded with its reason and its preemptor."""
        assert wi.cq is not None
        cq = wi.cq
        preemptor_path = cq.node.path()
        for victim, reason in victims:
            victim_path = victim.cq.node.path() if victim.cq is not None else f"/{victim.cq_name}"
            self.state.evict(victim)
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
                )
            )

    # --- 4. why-not and positions ------------------------------------------------------------

    def finish(self) -> CycleResult:
        state = self.state
        admitted = {d.workload for d in self.admissions}
        self._pend_unconsidered(admitted)
        reasons = self._queued_reasons()
        for key, entry in self.pending.items():
            # Failures are all of queued workloads: this is a reason tuple.
            assert not isinstance(entry, _Failure)
            reason, message, cq, lq = entry
            reasons[key] = PendingReason(key, reason, _text(message), cq, lq)
        return CycleResult(
            admissions=tuple(self.admissions),
            preemptions=tuple(self.preemptions),
            evictions=tuple(self.evictions),
            pending={key: reasons[key] for key in sorted(reasons)},
            local_queue_usage=dict(sorted(state.sampled_usage.items())),
        )

    def _pend_unconsidered(self, admitted: set[str]) -> None:
        """Workloads the loop never reached: behind a StrictFIFO blocker, or past the head limit."""
        for name, queue in self.queues.items():
            for wi in queue.remaining():
                if wi.why is not None or wi.key in admitted:
                    continue
                if queue.blocked_by is not None:
                    self._pend(
                        wi,
                        "StrictFIFO",
                        f"Waiting behind {queue.blocked_by.key} "
                        f"in the StrictFIFO ClusterQueue {name}",
                        name,
                    )
                else:
                    self._pend(
                        wi,
                        "Pending",
                        "Not considered in this cycle (one head per ClusterQueue)",
                        name,
                    )

    def _queued_reasons(self) -> dict[str, PendingReason]:
        """Why each queued workload waits, with its positions in queue order after this cycle.

        Every queued workload that was not admitted knows why it waits
        (``_pend_unconsidered`` ran): one that does not is admitted, and skipped.
        """
        state = self.state
        usage: dict[str, float] | None = None
        reasons: dict[str, PendingReason] = {}
        held_only = [name for name in self._held if name not in self.queues]
        for name in [*self.queues, *held_only]:
            queue = self.queues.get(name)
            held = self._held.get(name)
            items = queue.all_workloads() if queue is not None else []
            behind = queue.blocked_by.key if queue is not None and queue.blocked_by else None
            if held is None and queue is not None and queue.in_queue_order():
                # One LocalQueue: the position in it is the position in the ClusterQueue.
                position = 0
                for wi in items:
                    entry = wi.why
                    if entry is None:
                        continue
                    if type(entry) is _Failure:  # ``_reason_of``, inlined for the common case
                        reason, text = entry.reason, entry.message or entry.text()
                    else:
                        reason, text = _reason_of(entry)
                    key = wi.key
                    reasons[key] = self._reason(wi, reason, text, name, position, position, behind)
                    position += 1
                continue
            waiting = [w for w in items if w.why is not None]
            if held is not None:
                waiting.extend(held)
            if usage is None:
                usage = {lq: state.lq_usage(lq) for lq in state.lq_consumed}
            lq_usage = usage
            waiting.sort(key=lambda w: (lq_usage.get(w.lq, 0.0), -w.priority, w.time, w.seq))
            per_lq: dict[str, int] = {}
            for position, wi in enumerate(waiting):
                lq_position = per_lq.get(wi.lq, 0)
                per_lq[wi.lq] = lq_position + 1
                reason, text = _reason_of(wi.why)
                reasons[wi.key] = self._reason(
                    wi, reason, text, name, position, lq_position, behind
                )
        return reasons

    def _reason(
        self,
        wi: WorkloadInfo,
        reason: str,
        text: str,
        cq: str,
        position: int,
        lq_position: int,
        behind: str | None,
    ) -> PendingReason:
        """A queued workload's pending reason; a gang that can never fit gets its
        verdict instead (the true cause, never "N more needed"), unless the queue
        holds it back for a reason of its own (stopped, backing off, no cluster)."""
        verdict = None if reason in _HELD_REASONS else self._verdict(wi)
        if verdict is not None:
            return PendingReason(
                wi.key,
                verdict.reason,
                verdict.message,
                cq,
                wi.lq,
                position,
                lq_position,
                inadmissible=True,
                cause=verdict.cause,
            )
        behind = behind if reason == "StrictFIFO" else None
        return PendingReason(
            wi.key, reason, text, cq, wi.lq, position, lq_position, waiting_behind=behind
        )

    def _verdict(self, wi: WorkloadInfo) -> Verdict | None:
        """``never_fits``, once per ClusterQueue, gang shape and cluster selector."""
        assert wi.cq is not None
        selector = wi.wl.cluster_selector
        key = (wi.cq.name, wi.shape, None if selector is None else selector_key(selector))
        try:
            return self._verdicts[key]
        except KeyError:
            verdict = self._verdicts[key] = never_fits(self.state, wi)
            return verdict


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


def _reason_of(entry: object) -> tuple[str, str]:
    """``(reason, message)`` of a pending entry (``_Entry``)."""
    if type(entry) is _Failure:
        return entry.reason, entry.message or entry.text()
    assert isinstance(entry, tuple)
    reason, message = entry[0], entry[1]
    assert isinstance(reason, str) and isinstance(message, str | _Failure)
    return reason, _text(message)


def _text(message: str | _Failure) -> str:
    return message if isinstance(message, str) else message.text()


def _first_arrivals(
    order: list[int], keys: list[str], admitted: Container[str]
) -> Iterator[tuple[int, int]]:
    """``(seq, index)`` in arrival order, without repeats or workloads already admitted."""
    seen: set[str] = set()
    for seq, index in enumerate(order):
        key = keys[index]
        if key in seen or key in admitted:
            continue
        seen.add(key)
        yield seq, index


def _arrival_order(keys: list[str], times: list[float]) -> list[int]:
    """Indices sorted by ``(time, key, index)``: the ``seq`` order of pending workloads.

    Sorting by time alone (stable, so equal entries keep index order) and then
    re-sorting each run of equal times by key is the same order, at a fraction
    of the cost of sorting tuples.
    """
    order = sorted(range(len(times)), key=times.__getitem__)
    if len(set(times)) == len(times):
        return order  # no equal times: nothing to re-sort
    ordered = [times[i] for i in order]
    start = 0
    for position in range(1, len(ordered) + 1):
        if position < len(ordered) and ordered[position] == ordered[start]:
            continue
        if position - start > 1:
            order[start:position] = sorted(order[start:position], key=lambda i: (keys[i], i))
        start = position
    return order


def run_cycle(snapshot: Snapshot, now: float) -> CycleResult:
    cycle = _Cycle(snapshot, now)
    cycle.evict_stopped_and_unready()
    cycle.classify(list(snapshot.pending))
    cycle.run()
    return cycle.finish()
