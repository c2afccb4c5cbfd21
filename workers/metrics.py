"""Prometheus metrics of the scheduler, with Kueue's names where Kueue has
them (``pending_workloads``, ``admitted_workloads_total``,
``admission_wait_time_seconds``, ``cluster_queue_resource_usage``,
``admission_attempts_total``, ``admission_attempt_duration_seconds``,
``preempted_workloads_total``, ``evicted_workloads_total``), under the
``qm_`` prefix the API's metrics use; and our own: the reconcile lag
(admission to the job on its member), member readiness, the outbox depth,
leadership, and the gangs pending for fragmentation alone (issue 24).
``quartermaster scheduler --metrics-port`` serves them.

The cycle's gauges are set by the leader's cycles: a ClusterQueue that had
pending workloads or usage reads 0 once it has none (not a vanished
series)."""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.app.admission import CycleReport
from service.engine.fragmentation import FRAGMENTED_ACROSS_ISLANDS
from workers.sync import SyncReport

#: ``status`` of Kueue's ``pending_workloads``: "active" workloads wait their
#: turn in the queue (behind a StrictFIFO head, or past a head limit);
#: "inadmissible" ones were tried and did not fit, or cannot be tried now
#: (stopped queue, backoff, no such queue, ...).
ACTIVE, INADMISSIBLE = "active", "inadmissible"
WAITING_THEIR_TURN = frozenset({"Pending", "StrictFIFO"})

_WAIT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
_CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.pending = Gauge(
            "qm_pending_workloads",
            "Workloads waiting, by ClusterQueue and status: active (waiting their turn) "
            "or inadmissible (tried and did not fit, or cannot be tried now)",
            ["cluster_queue", "status"],
            registry=r,
        )
        self.fragmented = Gauge(
            "qm_fragmented_workloads",
            "Gangs pending only for fragmentation, by ClusterQueue: quota and the "
            "fleet's free total would hold them, no single island has room now",
            ["cluster_queue"],
            registry=r,
        )
        self.admitted = Counter(
            "qm_admitted_workloads", "Workloads admitted", ["cluster_queue"], registry=r
        )
        self.wait = Histogram(
            "qm_admission_wait_time_seconds",
            "From queued to admitted",
            ["cluster_queue"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.preempted = Counter(
            "qm_preempted_workloads",
            "Workloads preempted, by the preemptor's ClusterQueue and reason",
            ["preempting_cluster_queue", "reason"],
            registry=r,
        )
        self.evicted = Counter(
            "qm_evicted_workloads",
            "Workloads evicted other than by preemption",
            ["cluster_queue", "reason"],
            registry=r,
        )
        self.usage = Gauge(
            "qm_cluster_queue_resource_usage",
            "Quota held by admitted workloads (canonical units)",
            ["cluster_queue", "flavor", "resource"],
            registry=r,
        )
        self.attempts = Counter(
            "qm_admission_attempts",
            "Admission cycles, by result: success (something admitted) or inadmissible",
            ["result"],
            registry=r,
        )
        self.attempt_duration = Histogram(
            "qm_admission_attempt_duration_seconds",
            "One admission cycle, by result",
            ["result"],
            buckets=_CYCLE_BUCKETS,
            registry=r,
        )
        self.cycle = Histogram(
            "qm_admission_cycle_duration_seconds",
            "One admission cycle: snapshot, engine and commit",
            buckets=_CYCLE_BUCKETS,
            registry=r,
        )
        self.outbox_depth = Gauge(
            "qm_outbox_depth", "Committed outbox messages not yet relayed", registry=r
        )
        self.reconcile_lag = Histogram(
            "qm_reconcile_lag_seconds",
            "From admission to the job's creation on its member cluster",
            ["cluster"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.cluster_ready = Gauge(
            "qm_member_cluster_ready",
            "1 while a member cluster answers its sync, 0 while it does not",
            ["cluster"],
            registry=r,
        )
        self.leader = Gauge(
            "qm_admission_leader", "1 while this process leads admission", registry=r
        )
        self._pending_seen: set[tuple[str, ...]] = set()
        self._fragmented_seen: set[tuple[str, ...]] = set()
        self._usage_seen: set[tuple[str, ...]] = set()
        # Member readiness is set by the fleet loop's thread and cleared by the
        # cycle's when this process stops leading: one lock orders the two, so
        # a sync that ends after the step-down cannot bring a series back.
        self._leadership = threading.Lock()
        self._leading = False

    def observe(self, report: CycleReport) -> None:
        self.cycle.observe(report.seconds)
        if report.result.admissions or report.result.pending:  # something was tried
            result = "success" if report.result.admissions else "inadmissible"
            self.attempts.labels(result).inc()
            self.attempt_duration.labels(result).observe(report.seconds)
        pending = Tally(
            (p.cluster_queue or "", ACTIVE if p.reason in WAITING_THEIR_TURN else INADMISSIBLE)
            for p in report.result.pending.values()
        )
        _set_all(self.pending, {k: float(n) for k, n in pending.items()}, self._pending_seen)
        fragmented = Tally(
            (p.cluster_queue or "",)
            for p in report.result.pending.values()
            if p.cause == FRAGMENTED_ACROSS_ISLANDS
        )
        _set_all(
            self.fragmented, {k: float(n) for k, n in fragmented.items()}, self._fragmented_seen
        )
        for decision in report.result.admissions:
            self.admitted.labels(decision.cluster_queue).inc()
        for cq, seconds in report.writes.waits:
            self.wait.labels(cq).observe(seconds)
        for preemption in report.result.preemptions:
            self.preempted.labels(preemption.preemptor_cluster_queue, preemption.reason).inc()
        for eviction in report.result.evictions:
            self.evicted.labels(eviction.cluster_queue, eviction.reason).inc()
        usage: dict[tuple[str, ...], float] = {k: float(v) for k, v in report.usage.items()}
        _set_all(self.usage, usage, self._usage_seen)

    def leading(self, now: bool) -> None:
        """Whether this process leads admission, as of its last cycle. On
        stepping down, drop the series only the leader knows (queues'
        pending workloads and usage, members' readiness), so that a deposed
        scheduler does not go on reporting its last view beside the new
        leader's."""
        with self._leadership:
            if now == self._leading:
                return
            self._leading = now
            self.leader.set(1 if now else 0)
            if not now:
                for gauge in (self.pending, self.fragmented, self.usage, self.cluster_ready):
                    gauge.clear()
                self._pending_seen.clear()
                self._fragmented_seen.clear()
                self._usage_seen.clear()

    def observe_sync(self, report: SyncReport) -> None:
        """A member's sync: its readiness while this process leads (a sync
        finishing after the step-down is not shown), and its reconcile lags."""
        with self._leadership:
            if self._leading:
                self.cluster_ready.labels(report.cluster).set(1 if report.reachable else 0)
        for seconds in report.lags:
            self.reconcile_lag.labels(report.cluster).observe(seconds)


def _set_all(
    gauge: Gauge, values: Mapping[tuple[str, ...], float], seen: set[tuple[str, ...]]
) -> None:
    """Every series ``values`` names, and 0 for those seen before but not now."""
    for labels in seen - set(values):
        gauge.labels(*labels).set(0)
    for labels, value in values.items():
        gauge.labels(*labels).set(value)
    seen.update(values)
