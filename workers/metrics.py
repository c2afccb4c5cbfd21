"""Prometheus metrics of the scheduler, with Kueue's names where Kueue has
them (``pending_workloads``, ``admitted_workloads_total``,
``admission_wait_time_seconds``, ``cluster_queue_resource_usage``, …), under
the ``qm_`` prefix the API's metrics use."""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.app.admission import CycleReport
from workers.sync import SyncReport

_WAIT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
_CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.pending = Gauge(
            "qm_pending_workloads",
            "Workloads waiting, by ClusterQueue",
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

    def observe(self, report: CycleReport) -> None:
        self.cycle.observe(report.seconds)
        pending = Tally(p.cluster_queue or "" for p in report.result.pending.values())
        self.pending.clear()
        for cq, count in pending.items():
            self.pending.labels(cq).set(count)
        for decision in report.result.admissions:
            self.admitted.labels(decision.cluster_queue).inc()
        for cq, seconds in report.plan.waits:
            self.wait.labels(cq).observe(seconds)
        for preemption in report.result.preemptions:
            self.preempted.labels(preemption.preemptor_cluster_queue, preemption.reason).inc()
        for eviction in report.result.evictions:
            self.evicted.labels(eviction.cluster_queue, eviction.reason).inc()
        self.usage.clear()
        for (cq, flavor, resource), amount in report.usage.items():
            self.usage.labels(cq, flavor, resource).set(amount)

    def observe_sync(self, report: SyncReport) -> None:
        self.cluster_ready.labels(report.cluster).set(1 if report.reachable else 0)
        for seconds in report.lags:
            self.reconcile_lag.labels(report.cluster).observe(seconds)
