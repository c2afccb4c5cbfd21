"""The scheduler's Prometheus metrics, scraped over HTTP as an operator's
Prometheus would, move with what happens: gangs queued, admitted, running on
a member, cancelled; the outbox filling and draining; a member going silent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from service.app.admission import CycleReport, CycleWrites
from service.app.bootstrap import Services
from service.engine import CycleResult, PendingReason, admission_cycle
from service.runtime.embedded import free_port
from tests.engine.scenario import load
from tests.workers.conftest import ADMIN, GPU, wait_for, workload_status
from tests.workers.members import gang, members, scheduling, settings, setup_central
from workers.metrics import SchedulerMetrics
from workers.outbox import Send, relay_once

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


@contextmanager
def _served(registry: CollectorRegistry) -> Iterator[Callable[[], Samples]]:
    """``registry`` on ``/metrics`` of a free port; yields a scraper."""
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)

    def scrape() -> Samples:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    try:
        yield scrape
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_scheduler_metrics_move_and_are_scraped(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    cq = {"cluster_queue": "cq"}
    waiting = {"cluster_queue": "cq", "status": "inadmissible"}
    gpus = {"cluster_queue": "cq", "flavor": "h100", "resource": GPU}
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        # No relay in this scheduler: the outbox fills until the test drains it.
        with (
            scheduling(engine, settings(database_url, broker), send) as scheduler,
            _served(scheduler.metrics.registry) as scrape,
        ):
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="100000s"))
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Running", 60)
            # b comes once a holds the quota: a cycle tries it alone and admits
            # nothing (had both come to one cycle, that cycle admitted a, and
            # whether another tried b before the scrape was a race).
            services.submissions.submit(ADMIN, "team-a", gang("b", duration="100000s"))
            first = wait_for(
                lambda: (
                    (m := scrape())
                    and _value(m, "qm_reconcile_lag_seconds_count", cluster="c1")
                    and _value(m, "qm_admission_attempts_total", result="inadmissible")
                    and _value(m, "qm_pending_workloads", **waiting) == 1
                    and m
                ),
                60,
                "a admitted and running, b tried and left pending",
                seen=scrape,
            )
            assert _value(first, "qm_pending_workloads", **waiting) == 1  # b: no quota left
            assert _value(first, "qm_admitted_workloads_total", **cq) == 1
            assert _value(first, "qm_admission_wait_time_seconds_count", **cq) == 1
            assert _value(first, "qm_cluster_queue_resource_usage", **gpus) == 16
            assert _value(first, "qm_admission_attempts_total", result="success") == 1
            assert (_value(first, "qm_admission_attempts_total", result="inadmissible") or 0) >= 1
            assert _value(first, "qm_reconcile_lag_seconds_count", cluster="c1") == 1
            assert _value(first, "qm_member_cluster_ready", cluster="c1") == 1
            assert _value(first, "qm_admission_leader") == 1
            assert (_value(first, "qm_outbox_depth") or 0) >= 2  # wakes and reconcile hints
            relay_once(engine, send)
            wait_for(lambda: _value(scrape(), "qm_outbox_depth") == 0, 60)

            services.submissions.cancel(ADMIN, "team-a", "a")
            wait_for(lambda: workload_status(engine, "team-a", "b")["state"] == "Running", 60)
            then = wait_for(
                lambda: (
                    (m := scrape())
                    and _value(m, "qm_reconcile_lag_seconds_count", cluster="c1") == 2
                    and m
                ),
                60,
            )
            assert _value(then, "qm_admitted_workloads_total", **cq) == 2
            assert _value(then, "qm_pending_workloads", **waiting) == 0  # 0, not a vanished series
            assert _value(then, "qm_admission_wait_time_seconds_count", **cq) == 2
            assert _value(then, "qm_cluster_queue_resource_usage", **gpus) == 16  # b's alone
            assert _value(then, "qm_admission_attempts_total", result="success") == 2

            c1.partition()
            wait_for(lambda: _value(scrape(), "qm_member_cluster_ready", cluster="c1") == 0, 60)
            c1.heal()
            wait_for(lambda: _value(scrape(), "qm_member_cluster_ready", cluster="c1") == 1, 60)


def test_pending_workloads_are_split_by_kueue_status() -> None:
    """Kueue's ``pending_workloads{status}``: "active" ones wait their turn
    (behind a StrictFIFO head, past a head limit); "inadmissible" ones were
    tried and did not fit, or cannot be tried now. A status that empties
    reads 0."""
    metrics = SchedulerMetrics()

    def cycle(*reasons: tuple[str, str | None]) -> None:
        pending = {
            f"ns/w{i}": PendingReason(f"ns/w{i}", reason, "", cq)
            for i, (reason, cq) in enumerate(reasons)
        }
        result = CycleResult(pending=pending)
        metrics.observe(CycleReport(result, CycleWrites(), len(pending), 0, 0.01, {}))

    def value(cq: str, status: str) -> float | None:
        return metrics.registry.get_sample_value(
            "qm_pending_workloads", {"cluster_queue": cq, "status": status}
        )

    cycle(
        ("StrictFIFO", "a"),
        ("Pending", "a"),
        ("WaitingForQuota", "a"),
        ("ClusterQueueStopped", "b"),
        ("RequeueBackoff", "b"),
        ("LocalQueueNotFound", None),
    )
    assert (value("a", "active"), value("a", "inadmissible")) == (2, 1)
    assert (value("b", "active"), value("b", "inadmissible")) == (None, 2)
    assert value("", "inadmissible") == 1
    cycle(("WaitingForQuota", "a"))
    assert (value("a", "active"), value("a", "inadmissible")) == (0, 1)
    assert value("b", "inadmissible") == 0


def test_gangs_pending_for_fragmentation_alone_are_counted_by_cluster_queue() -> None:
    """Issue 24: the engine's own cycle on the scenario where four islands,
    each a quarter used, hold 96 free GPUs and a 32-GPU gang fits none; then
    a cycle without it reads 0, not a vanished series."""
    scenarios = Path(__file__).parents[1] / "engine" / "scenarios"
    scenario = load(scenarios / "qm_fragmented_across_islands.yaml")
    result = admission_cycle(scenario.snapshot, scenario.now)
    metrics = SchedulerMetrics()
    metrics.observe(CycleReport(result, CycleWrites(), len(result.pending), 0, 0.01, {}))

    def fragmented() -> float | None:
        return metrics.registry.get_sample_value(
            "qm_fragmented_workloads", {"cluster_queue": "team"}
        )

    assert fragmented() == 1
    inadmissible = {"cluster_queue": "team", "status": "inadmissible"}
    assert metrics.registry.get_sample_value("qm_pending_workloads", inadmissible) == 1
    metrics.observe(CycleReport(CycleResult(), CycleWrites(), 0, 0, 0.01, {}))
    assert fragmented() == 0
