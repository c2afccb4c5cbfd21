"""The replay loop: the admission engine in virtual time, with no database.

Events are job arrivals (at ``submission_time``) and completions (a run ends
``duration`` seconds after its admission). Whenever something happened, an
admission cycle runs — at the event's time, but at most once per
``cycle_interval`` seconds of virtual time, like a scheduler that wakes up
periodically — on a snapshot of the fleet, the running gangs and the waiting
ones. Its decisions are applied: admitted gangs start; preempted gangs stop at
once, lose their progress since their last checkpoint (all of it unless
``checkpoint_interval`` is set: then each job saves every ``interval`` seconds
of its run, a seeded interval per job, see :func:`checkpoint_interval_of`) and
queue again, ordered by the time of their eviction as Kueue's default
``requeuingTimestamp: Eviction`` does. The engine is told each running gang's
last checkpoint, as the workers tell it from the job's annotation.
The admission fair-sharing history the engine returns is fed back into the
next cycle. Every admission is checked: each node's pods within allocatable,
and a gang that asked for one fabric island placed inside one
(``island_violations``).

A gang of ``n`` GPUs is one pod of ``n`` GPUs up to ``gpus_per_pod``, else
``ceil(n / gpus_per_pod)`` pods of ``gpus_per_pod`` GPUs that require one
fabric island (all-reduce traffic stays on the island's fabric).
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from service.domain.quota import (
    ClusterQueue,
    FlavorQuotas,
    PreemptionBudget,
    ResourceGroup,
    ResourceQuota,
)
from service.domain.workload import AdmittedWorkload, PodSet, TopologyRequest, Workload
from service.engine import (
    AdmissionFairSharingConfig,
    CycleResult,
    EngineConfig,
    LocalQueueUsage,
    PreemptionBudgetState,
    Snapshot,
    admission_cycle,
)
from service.engine.protection import CONSOLIDATION
from sim.fleet import Fleet
from sim.replay.metrics import (
    SIZE_CLASSES,
    contended_jain,
    jain_index,
    percentile,
    size_class,
    summary,
    weighted_max_min,
)
from sim.replay.trace import TraceJob, stable_team

__all__ = ["GPU", "ReplayOptions", "Simulator", "fifo_fleet", "replay", "single_queue_fleet"]

GPU = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    cycle_interval: float = 60.0
    gpus_per_pod: int = 8
    #: Window of the contended-fairness measure (seconds).
    fairness_window: float = 3600.0
    engine: EngineConfig = field(default_factory=EngineConfig)
    label: str = "quartermaster"
    #: Mean seconds between a job's checkpoints; ``None``: no job ever saves (as before).
    checkpoint_interval: float | None = None
    #: Seeds each job's own interval (:func:`checkpoint_interval_of`).
    checkpoint_seed: int = 0
    #: Salts the assignment of jobs without a team (:func:`stable_team`).
    team_seed: int = 0
    #: ``False``: the jobs still save and restart from checkpoints, but the engine is
    #: not told (the engine before issue 24 never weighed them).
    engine_sees_checkpoints: bool = True
    #: Set on every ClusterQueue of the fleet: ``preemption.protection.minRuntimeSeconds``.
    min_runtime: int | None = None
    #: Set on every ClusterQueue of the fleet: ``preemption.budget`` (tokens, period s).
    preemption_budget: tuple[int, int] | None = None
    #: Set on every ClusterQueue of the fleet:
    #: ``preemption.protection.islandGangGraceSeconds``.
    island_gang_grace: int | None = None


def checkpoint_interval_of(job_id: str, mean: float, seed: int) -> float:
    """A job's checkpoint interval: uniform in [mean / 2, 3 mean / 2], drawn from
    a generator seeded by ``seed`` and the job id, so every replay of a trace
    gives each job the same interval whatever the order it is asked in."""
    return random.Random(f"{seed}:{job_id}").uniform(0.5 * mean, 1.5 * mean)


@dataclass(slots=True)
class _Run:
    job: TraceJob
    team: str
    admitted: AdmittedWorkload
    start: float
    end: float
    #: Seconds of its work saved before this run began (its last checkpoint).
    done: float = 0.0


@dataclass(slots=True)
class _Stats:
    first_admission: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    #: Job id → when it last entered the queue (submission, or its re-queue).
    queued_at: dict[str, float] = field(default_factory=dict)
    #: Job id → its wait before the first admission.
    first_wait: dict[str, float] = field(default_factory=dict)
    #: Job id → the sum of all its waits, re-queues included.
    total_wait: dict[str, float] = field(default_factory=dict)
    busy_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    #: GPU-seconds a preempted run kept thanks to a checkpoint.
    saved_gpu_s: float = 0.0
    team_gpu_s: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0
    evictions: int = 0
    island_violations: int = 0
    capacity_violations: int = 0
    cycles: int = 0
    engine_s: float = 0.0
    #: ``(team, gpus, start, end)`` of every run, completed or preempted.
    runs: list[tuple[str, int, float, float]] = field(default_factory=list)
    max_pending: int = 0
    #: Preemptions per reason (``Consolidation`` among them).
    by_reason: dict[str, int] = field(default_factory=dict)
    #: Preemptions per size class of the victim: who pays for them.
    by_victim_size: dict[str, int] = field(default_factory=dict)
    #: Job id of a consolidation victim -> when it was moved (until it runs again).
    moved_at: dict[str, float] = field(default_factory=dict)
    #: Each consolidation victim's wait from its move to its next admission.
    move_waits: list[float] = field(default_factory=list)


def team_queues(fleet: Fleet) -> dict[str, str]:
    """Team (namespace) → the LocalQueue its jobs go to (the first by name)."""
    queues: dict[str, str] = {}
    for lq in sorted(fleet.local_queues, key=lambda q: (q.namespace, q.name)):
        queues.setdefault(lq.namespace, lq.name)
    return queues


def team_cluster_queues(fleet: Fleet) -> dict[str, str]:
    """Team → the ClusterQueue its LocalQueue (:func:`team_queues`) feeds."""
    cq_of = {(lq.namespace, lq.name): lq.cluster_queue for lq in fleet.local_queues}
    return {team: cq_of[(team, name)] for team, name in team_queues(fleet).items()}


def nominal_gpus(cq: ClusterQueue) -> int:
    """A ClusterQueue's nominal GPUs, over all its flavors."""
    return sum(
        quota.nominal
        for group in cq.resource_groups
        for flavor in group.flavors
        for resource, quota in flavor.resources.items()
        if resource == GPU
    )


def entitlements(fleet: Fleet) -> dict[str, float]:
    """Each team's nominal GPUs: its ClusterQueue's, split among the teams that share it."""
    cq_of = team_cluster_queues(fleet)
    sharing: dict[str, int] = {}
    for cq_name in cq_of.values():
        sharing[cq_name] = sharing.get(cq_name, 0) + 1
    nominal = {cq.name: float(nominal_gpus(cq)) for cq in fleet.cluster_queues}
    return {team: nominal.get(cq, 0.0) / sharing[cq] for team, cq in cq_of.items()}


def fifo_fleet(fleet: Fleet) -> Fleet:
    """The FIFO baseline: one StrictFIFO ClusterQueue with every team's quota, no cohorts.

    Same clusters, nodes, flavors and island-aware placement; what goes is the
    quota tree, borrowing, preemption and fair sharing: jobs start in
    submission order and the head of the line blocks everyone behind it.
    """
    totals: dict[str, dict[str, int]] = {}
    order: list[str] = []
    for cq in fleet.cluster_queues:
        for group in cq.resource_groups:
            for flavor in group.flavors:
                if flavor.name not in totals:
                    order.append(flavor.name)
                bucket = totals.setdefault(flavor.name, {})
                for resource, quota in flavor.resources.items():
                    bucket[resource] = bucket.get(resource, 0) + quota.nominal
    resources = sorted({r for bucket in totals.values() for r in bucket})
    group = ResourceGroup(
        covered_resources=tuple(resources),
        flavors=tuple(
            FlavorQuotas(name, {r: ResourceQuota(totals[name].get(r, 0)) for r in resources})
            for name in order
        ),
    )
    fifo = ClusterQueue(name="fifo", resource_groups=(group,), queueing_strategy="StrictFIFO")
    return replace(
        fleet,
        cohorts=(),
        cluster_queues=(fifo,),
        local_queues=tuple(replace(lq, cluster_queue="fifo") for lq in fleet.local_queues),
    )


def single_queue_fleet(fleet: Fleet) -> Fleet:
    """One BestEffortFIFO ClusterQueue whose quota is the whole fleet: no quota binds.

    The engine configured like the best-fit baseline (:mod:`sim.replay.baseline`):
    one queue in which a job that fits starts past one that does not, every
    resource's nominal quota the fleet's physical total of its flavor, no
    cohort, preemption or fair sharing (use :func:`fifo_options` with it).
    """
    totals: dict[str, dict[str, int]] = {}
    for node in fleet.nodes():
        bucket = totals.setdefault(node.flavor, {})
        for resource, amount in node.allocatable.items():
            bucket[resource] = bucket.get(resource, 0) + amount
    resources = sorted({r for bucket in totals.values() for r in bucket})
    group = ResourceGroup(
        covered_resources=tuple(resources),
        flavors=tuple(
            FlavorQuotas(name, {r: ResourceQuota(totals[name].get(r, 0)) for r in resources})
            for name in sorted(totals)
        ),
    )
    queue = ClusterQueue(
        name="single", resource_groups=(group,), queueing_strategy="BestEffortFIFO"
    )
    return replace(
        fleet,
        cohorts=(),
        cluster_queues=(queue,),
        local_queues=tuple(replace(lq, cluster_queue="single") for lq in fleet.local_queues),
    )


def protected_fleet(fleet: Fleet, options: ReplayOptions) -> Fleet:
    """``fleet`` with the replay's protection on every ClusterQueue (when given)."""
    grace = options.island_gang_grace
    if options.min_runtime is None and options.preemption_budget is None and grace is None:
        return fleet
    queues = []
    for cq in fleet.cluster_queues:
        policy = cq.preemption
        if options.min_runtime is not None:
            protection = replace(policy.protection, min_runtime_seconds=options.min_runtime)
            policy = replace(policy, protection=protection)
        if grace is not None:
            protection = replace(policy.protection, island_gang_grace_seconds=grace)
            policy = replace(policy, protection=protection)
        if options.preemption_budget is not None:
            tokens, period = options.preemption_budget
            policy = replace(policy, budget=PreemptionBudget(tokens, period))
        queues.append(replace(cq, preemption=policy))
    return replace(fleet, cluster_queues=tuple(queues))


def fifo_options(options: ReplayOptions) -> ReplayOptions:
    engine = replace(
        options.engine,
        admission_fair_sharing=AdmissionFairSharingConfig(enable=False),
    )
    return replace(options, engine=engine, label="fifo")


class Simulator:
    """Replays ``jobs`` on ``fleet``; :meth:`run` returns the RESULT mapping."""

    def __init__(
        self,
        fleet: Fleet,
        jobs: list[TraceJob],
        options: ReplayOptions,
        policy: Callable[[Snapshot, float], CycleResult] | None = None,
    ) -> None:
        fleet = protected_fleet(fleet, options)
        self.fleet = fleet
        #: What decides each cycle: the engine, or a baseline of :mod:`sim.replay.baseline`.
        self.policy = policy or admission_cycle
        self.options = options
        self.queues = team_queues(fleet)
        if not self.queues:
            raise ValueError("the fleet defines no LocalQueue for jobs to go to")
        teams = sorted(self.queues)
        self.jobs = [j for j in jobs if j.num_gpu > 0]
        self.skipped = len(jobs) - len(self.jobs)
        self.team_of = {
            j.job_id: j.team
            if j.team in self.queues
            else stable_team(j.job_id, teams, options.team_seed)
            for j in self.jobs
        }
        self.by_key = {f"{self.team_of[j.job_id]}/{j.job_id}": j for j in self.jobs}
        self.nodes = tuple(fleet.nodes())
        self.allocatable = {n.name: n.allocatable for n in self.nodes}
        self.capacity_gpus = sum(n.allocatable.get(GPU, 0) for n in self.nodes)
        self.clusters = fleet.cluster_objects()
        self.namespaces = {
            **{team: {} for team in self.queues},
            **{ns: dict(labels) for ns, labels in fleet.namespaces.items()},
        }
        self.pending: dict[str, Workload] = {}
        self.running: dict[str, _Run] = {}
        self.used: dict[str, dict[str, int]] = {}
        self.usage: Mapping[str, LocalQueueUsage] = {}
        self.budgets: Mapping[str, PreemptionBudgetState] = {}
        self.stats = _Stats()
        self._completions: list[tuple[float, str, int]] = []
        self._generation: dict[str, int] = {}
        #: Workload key -> seconds of its work saved by checkpoints so far.
        self._saved: dict[str, float] = {}
        self._intervals: dict[str, float] = {}

    # --- workloads ----------------------------------------------------------------------

    def workload(self, job: TraceJob) -> Workload:
        team = self.team_of[job.job_id]
        per_pod = min(job.num_gpu, self.options.gpus_per_pod)
        pods = math.ceil(job.num_gpu / per_pod)
        topology = TopologyRequest("required") if pods > 1 else None
        return Workload(
            namespace=team,
            name=job.job_id,
            queue_name=self.queues[team],
            pod_sets=(PodSet("main", pods, {GPU: per_pod}, topology_request=topology),),
            creation_time=job.submission_time,
            priority=job.priority,
            priority_class_name=job.priority_class,
        )

    # --- applying a cycle ---------------------------------------------------------------

    def _place(self, run: _Run, sign: int) -> None:
        requests = {ps.name: ps.requests for ps in run.admitted.workload.pod_sets}
        for assignment in run.admitted.admission.pod_set_assignments:
            for node, pods in assignment.placement:
                bucket = self.used.setdefault(node, {})
                for resource, amount in requests[assignment.name].items():
                    bucket[resource] = bucket.get(resource, 0) + sign * amount * pods
                    if sign > 0 and bucket[resource] > self.allocatable[node].get(resource, 0):
                        self.stats.capacity_violations += 1

    def _stop(self, key: str, now: float) -> _Run:
        run = self.running.pop(key)
        self._place(run, -1)
        self._generation[key] = self._generation.get(key, 0) + 1
        gpus = run.job.num_gpu * (now - run.start)
        self.stats.runs.append((run.team, run.job.num_gpu, run.start, now))
        self.stats.busy_gpu_s += gpus
        self.stats.team_gpu_s[run.team] = self.stats.team_gpu_s.get(run.team, 0.0) + gpus
        return run

    def _interval(self, job: TraceJob) -> float | None:
        mean = self.options.checkpoint_interval
        if mean is None or mean <= 0:
            return None
        found = self._intervals.get(job.job_id)
        if found is None:
            found = checkpoint_interval_of(job.job_id, mean, self.options.checkpoint_seed)
            self._intervals[job.job_id] = found
        return found

    def _kept(self, run: _Run, now: float) -> float:
        """Seconds of this run's work its last checkpoint before ``now`` saved."""
        interval = self._interval(run.job)
        if interval is None:
            return 0.0
        saved = math.floor((now - run.start) / interval) * interval
        return min(saved, run.job.duration - run.done)

    def _requeue(self, run: _Run, now: float) -> None:
        kept = self._kept(run, now)
        self._saved[run.admitted.workload.key] = run.done + kept
        self.stats.lost_gpu_s += run.job.num_gpu * (now - run.start - kept)
        self.stats.saved_gpu_s += run.job.num_gpu * kept
        self.stats.queued_at[run.job.job_id] = now
        self.pending[run.admitted.workload.key] = replace(run.admitted.workload, queued_at=now)

    def _island_ok(self, wl: Workload, admitted: AdmittedWorkload) -> bool:
        by_name = {a.name: a for a in admitted.admission.pod_set_assignments}
        for ps in wl.pod_sets:
            assignment = by_name.get(ps.name)
            if assignment is None or sum(p for _, p in assignment.placement) != ps.count:
                return False
            required = ps.topology_request is not None and ps.topology_request.mode == "required"
            if required and len(assignment.islands) != 1:
                return False
        return True

    def apply(self, result: CycleResult, now: float) -> None:
        for preemption in result.preemptions:
            self.stats.preemptions += 1
            reasons = self.stats.by_reason
            reasons[preemption.reason] = reasons.get(preemption.reason, 0) + 1
            run = self._stop(preemption.workload, now)
            victims = self.stats.by_victim_size
            victim_class = size_class(run.job.num_gpu)
            victims[victim_class] = victims.get(victim_class, 0) + 1
            if preemption.reason == CONSOLIDATION:
                self.stats.moved_at[run.job.job_id] = now
            self._requeue(run, now)
        for eviction in result.evictions:
            self.stats.evictions += 1
            if eviction.workload in self.running:
                self._requeue(self._stop(eviction.workload, now), now)
        for decision in result.admissions:
            wl = self.pending.pop(decision.workload)
            job = self.by_key[decision.workload]
            admitted = AdmittedWorkload(wl, decision.admission, admitted_at=now)
            if not self._island_ok(wl, admitted):
                self.stats.island_violations += 1
            done = self._saved.get(decision.workload, 0.0)
            run = _Run(
                job, self.team_of[job.job_id], admitted, now, now + job.duration - done, done
            )
            self.running[decision.workload] = run
            self._place(run, 1)
            self._record_wait(job.job_id, now)
            moved = self.stats.moved_at.pop(job.job_id, None)
            if moved is not None:
                self.stats.move_waits.append(now - moved)
            generation = self._generation.get(decision.workload, 0)
            heapq.heappush(self._completions, (run.end, decision.workload, generation))
        self.usage = result.local_queue_usage
        self.budgets = result.preemption_budgets

    def _record_wait(self, job_id: str, now: float) -> None:
        stats = self.stats
        wait = now - stats.queued_at[job_id]
        stats.total_wait[job_id] = stats.total_wait.get(job_id, 0.0) + wait
        stats.first_wait.setdefault(job_id, wait)
        stats.first_admission.setdefault(job_id, now)

    def _admitted(self, now: float | None) -> tuple[AdmittedWorkload, ...]:
        """The running gangs, each with its last checkpoint when jobs save."""
        options = self.options
        if (
            now is None
            or options.checkpoint_interval is None
            or not options.engine_sees_checkpoints
        ):
            return tuple(run.admitted for run in self.running.values())
        out = []
        for run in self.running.values():
            kept = self._kept(run, now)
            at = run.start + kept if kept > 0 else None
            out.append(replace(run.admitted, last_checkpoint=at))
        return tuple(out)

    def snapshot(self, now: float | None = None) -> Snapshot:
        fleet = self.fleet
        return Snapshot(
            cluster_queues=fleet.cluster_queues,
            resource_flavors=fleet.resource_flavors,
            cohorts=fleet.cohorts,
            local_queues=fleet.local_queues,
            priority_classes=fleet.priority_classes,
            topologies=fleet.topologies,
            clusters=self.clusters,
            nodes=self.nodes,
            admitted=self._admitted(now),
            pending=tuple(self.pending.values()),
            namespaces=self.namespaces,
            local_queue_usage=self.usage,
            config=self.options.engine,
            preemption_budgets=self.budgets,
        )

    # --- the loop -----------------------------------------------------------------------

    def _next_completion(self) -> float | None:
        heap = self._completions
        while heap:
            end, key, generation = heap[0]
            if key in self.running and self._generation.get(key, 0) == generation:
                return end
            heapq.heappop(heap)
        return None

    def _complete_until(self, until: float) -> None:
        while True:
            end = self._next_completion()
            if end is None or end > until:
                return
            _, key, _ = heapq.heappop(self._completions)
            run = self._stop(key, end)
            self.stats.finished[run.job.job_id] = end

    def run(self, progress: Callable[[int, float], None] | None = None) -> dict[str, Any]:
        started = time.perf_counter()
        jobs = self.jobs
        index = 0
        last_cycle = -math.inf
        interval = self.options.cycle_interval
        # With a head ceiling a cycle may leave admissible heads behind: wake
        # again one interval later, as Kueue requeues the next heads at once.
        ceiling = self.options.engine.max_heads_per_cluster_queue is not None
        again = False
        while True:
            candidates = [last_cycle + interval] if again else []
            if index < len(jobs):
                candidates.append(jobs[index].submission_time)
            completion = self._next_completion()
            if completion is not None:
                candidates.append(completion)
            if not candidates:
                break  # whatever still waits can never be admitted
            now = max(min(candidates), last_cycle + interval)
            self._complete_until(now)
            while index < len(jobs) and jobs[index].submission_time <= now:
                wl = self.workload(jobs[index])
                self.pending[wl.key] = wl
                self.stats.queued_at[jobs[index].job_id] = jobs[index].submission_time
                index += 1
            self.stats.max_pending = max(self.stats.max_pending, len(self.pending))
            if self.pending:
                clock = time.perf_counter()
                result = _cycle(self.policy, self.snapshot(now), now)
                self.stats.engine_s += time.perf_counter() - clock
                self.stats.cycles += 1
                self.apply(result, now)
                again = ceiling and bool(result.admissions) and bool(self.pending)
                # A consolidation's victims were checked to fit now: run the next
                # cycle one interval later rather than at the next event.
                again = again or any(p.reason == CONSOLIDATION for p in result.preemptions)
            last_cycle = now
            if progress is not None:
                progress(len(self.stats.finished), now)
        return self.result(time.perf_counter() - started)

    # --- RESULT -------------------------------------------------------------------------

    def honest_waits(self) -> dict[str, Any]:
        """Waits with re-queues, delays, per size class and team (see ``metrics``)."""
        stats = self.stats
        by_size: dict[str, list[TraceJob]] = {}
        by_team: dict[str, list[TraceJob]] = {}
        for job in self.jobs:
            by_size.setdefault(size_class(job.num_gpu), []).append(job)
            by_team.setdefault(self.team_of[job.job_id], []).append(job)
        order = {name: i for i, (_, name) in enumerate(SIZE_CLASSES)}
        overall = _job_figures(self.jobs, stats)
        del overall["jobs"]
        return {
            **overall,
            "by_size": {
                name: _job_figures(by_size[name], stats)
                for name in sorted(by_size, key=lambda n: order.get(n, len(order)))
            },
            "by_team": {team: _job_figures(by_team[team], stats) for team in sorted(by_team)},
        }

    def result(self, wall_s: float) -> dict[str, Any]:
        stats = self.stats
        jobs = self.jobs
        first = min((j.submission_time for j in jobs), default=0.0)
        last = max(stats.finished.values(), default=first)
        makespan = last - first
        waits = [stats.first_wait[j.job_id] for j in jobs if j.job_id in stats.first_wait]
        demand: dict[str, float] = {}
        for job in jobs:
            team = self.team_of[job.job_id]
            demand[team] = demand.get(team, 0.0) + job.num_gpu * job.duration
        weights = entitlements(self.fleet)
        delivered = sum(stats.team_gpu_s.values())
        fair = weighted_max_min(delivered, demand, weights)
        ratios = [stats.team_gpu_s.get(t, 0.0) / fair[t] for t in sorted(fair) if fair[t] > 0]
        capacity_s = self.capacity_gpus * makespan
        presence = [
            (
                self.team_of[j.job_id],
                j.num_gpu,
                j.submission_time,
                stats.finished.get(j.job_id, last),
            )
            for j in jobs
        ]
        windowed, contended = contended_jain(
            stats.runs,
            presence,
            weights,
            self.capacity_gpus,
            self.options.fairness_window,
        )
        return {
            "scheduler": self.options.label,
            "jobs": len(jobs) + self.skipped,
            "skipped_zero_gpu": self.skipped,
            "admitted": len(stats.first_admission),
            "completed": len(stats.finished),
            "never_admitted": len(jobs) - len(stats.first_admission),
            "makespan_s": round(makespan, 1),
            "gpu_utilization": round(stats.busy_gpu_s / capacity_s, 4) if capacity_s else 0.0,
            "goodput_utilization": round((stats.busy_gpu_s - stats.lost_gpu_s) / capacity_s, 4)
            if capacity_s
            else 0.0,
            "mean_wait_s": round(sum(waits) / len(waits), 1) if waits else 0.0,
            "p95_wait_s": round(percentile(waits, 95), 1),
            **self.honest_waits(),
            "jain_fairness": round(windowed, 4),
            "jain_fairness_whole_run": round(jain_index(ratios), 4),
            "contended_windows": contended,
            "team_gpu_hours": {t: round(v / 3600, 1) for t, v in sorted(stats.team_gpu_s.items())},
            "preemptions": stats.preemptions,
            "preemptions_by_reason": dict(sorted(stats.by_reason.items())),
            "preemptions_by_victim_size": dict(sorted(stats.by_victim_size.items())),
            "consolidation_victim_wait_s": summary(stats.move_waits),
            "min_runtime_s": self.options.min_runtime,
            "island_gang_grace_s": self.options.island_gang_grace,
            "preemption_budget": list(self.options.preemption_budget)
            if self.options.preemption_budget
            else None,
            "lost_gpu_hours": round(stats.lost_gpu_s / 3600, 1),
            "checkpoint_saved_gpu_hours": round(stats.saved_gpu_s / 3600, 1),
            "checkpoint_interval_s": self.options.checkpoint_interval,
            "island_violations": stats.island_violations,
            "capacity_violations": stats.capacity_violations,
            "cycles": stats.cycles,
            "max_pending": stats.max_pending,
            "engine_s": round(stats.engine_s, 2),
            "wall_s": round(wall_s, 2),
        }


def _job_figures(jobs: list[TraceJob], stats: _Stats) -> dict[str, dict[str, float] | int]:
    """Job count, first wait, every wait and delay of ``jobs`` (completed ones)."""
    done = [j for j in jobs if j.job_id in stats.finished]
    return {
        "jobs": len(done),
        "first_wait_s": summary([stats.first_wait[j.job_id] for j in done]),
        "wait_s": summary([stats.total_wait[j.job_id] for j in done]),
        "delay_s": summary(
            [stats.finished[j.job_id] - j.submission_time - j.duration for j in done]
        ),
    }


def _cycle(
    policy: Callable[[Snapshot, float], CycleResult], snapshot: Snapshot, now: float
) -> CycleResult:
    """One admission cycle with the garbage collector paused (see ``service.engine``)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return policy(snapshot, now)
    finally:
        if collecting:
            gc.enable()


def replay(
    fleet: Fleet,
    jobs: list[TraceJob],
    options: ReplayOptions | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """Replay ``jobs`` on ``fleet`` and return the RESULT mapping."""
    return Simulator(fleet, jobs, options or ReplayOptions()).run(progress)
