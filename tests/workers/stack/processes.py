"""The stack's processes (API, Celery workers, scheduler, stand-ins) under one
supervisor, as standalone mode runs them."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from service.runtime.demo import StandIn, register_clusters, stand_ins
from service.runtime.embedded import free_port
from service.runtime.supervisor import Child, Supervisor
from tests.waiting import LONG_CEILING
from tests.waiting import wait_for as wait_until
from tests.workers.stack.names import ROOT, TOKEN

#: Worker and scheduler knobs for tests: quick cycles, resyncs and heartbeats.
FAST = {
    "QM_CYCLE_INTERVAL": "0.5",
    "QM_RESYNC_INTERVAL": "1",
    "QM_HEARTBEAT_INTERVAL": "2",
    "QM_CLUSTER_LEASE": "120",
    "QM_RELAY_POLL_INTERVAL": "0.5",
    "QM_VISIBILITY_TIMEOUT": "60",
    "QM_TASK_TIME_LIMIT": "30",
    "QM_RETRY_BACKOFF_MAX": "2",
    "QM_DELETE_WAIT": "10",
    "QM_MEMBER_CONNECT_TIMEOUT": "2",
    "QM_MEMBER_READ_TIMEOUT": "10",
}


def _service() -> list[str]:
    return [sys.executable, "-m", "service"]


def _workers() -> list[str]:
    return [sys.executable, "-m", "workers.cli"]


@dataclass(frozen=True)
class _Starting:
    """A part's process, launched: ``ready`` says when it serves, ``started``
    records it on the stack then."""

    child: Child
    ready: Callable[[], bool]
    started: Callable[[], None] | None = None


@dataclass
class Stack:
    """API, Celery workers, scheduler and stand-in member clusters, each a
    process of its own under one supervisor."""

    workdir: Path
    database_url: str
    broker_url: str
    env: Mapping[str, str] = field(default_factory=dict)
    supervisor: Supervisor = field(init=False)
    api_url: str = field(init=False, default="")
    metrics_url: str = field(init=False, default="")
    kubeconfig: Path = field(init=False)
    members: list[StandIn] = field(default_factory=list, init=False)
    api: Child | None = field(init=False, default=None)
    workers: list[Child] = field(default_factory=list, init=False)
    scheduler: Child | None = field(init=False, default=None)
    #: Every API process started, by name (``api``, ``api1``, …), with its URL.
    api_urls: dict[str, str] = field(default_factory=dict, init=False)
    #: Every scheduler started, by name (``scheduler``, ``scheduler1``, …),
    #: with its metrics URL.
    scheduler_metrics: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.kubeconfig = self.workdir / "clusters" / "kubeconfig"
        # What a SIGKILLed child leaves in its temporary directory (Celery's
        # pymp-* folders, a kubeconfig's CA file) stays in the test's folder.
        scratch = self.workdir / "tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            PYTHONUNBUFFERED="1",
            PYTHONPATH=str(ROOT),
            QM_DATABASE_URL=self.database_url,
            QM_BROKER_URL=self.broker_url,
            QM_BOOTSTRAP_TOKEN=TOKEN,
            QM_SECRET_KEY="e2e-secret-key-e2e-secret-key-0123",
            QM_DATA_DIR=str(self.workdir),
            TMPDIR=str(scratch),
        )
        env.update(self.env)
        self.supervisor = Supervisor(self.workdir / "logs", env)

    # -- starting ------------------------------------------------------------------------

    def start_clusters(
        self, fleet: Path, count: int, time_scale: float, controllers: bool = True
    ) -> None:
        """``controllers=False``: API servers only (no scheduler, kubelet or
        Kueue): jobs are stored and nothing runs them."""
        self._await(self._launch_clusters(fleet, count, time_scale, controllers))

    def _launch_clusters(
        self, fleet: Path, count: int, time_scale: float, controllers: bool = True
    ) -> _Starting:
        self.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        child = self.supervisor.start(
            "clusters",
            [
                *(sys.executable, "-m", "sim.cli"),
                *("cluster", "--fleet", str(fleet), "--count", str(count)),
                *("--port", "0", "--time-scale", str(time_scale)),
                *("--kubeconfig-out", str(self.kubeconfig)),
                *(() if controllers else ("--no-controllers",)),
            ],
        )

        def started() -> None:
            self.members = stand_ins(self.kubeconfig)

        return _Starting(child, lambda: "kubeconfig written" in child.output(), started)

    def start_api(self, processes: int = 1, port: int | None = None) -> Child:
        """An API process (``processes`` uvicorn workers). Called again, another
        one beside it (``api1``, …), on ``port`` if given (a killed one's, so
        that its clients find the new one where they knew the old); the first
        stays ``api`` / ``api_url``."""
        return self._await(self._launch_api(processes, port))

    def _launch_api(self, processes: int = 1, port: int | None = None) -> _Starting:
        port = port or free_port()
        url = f"http://127.0.0.1:{port}"
        name = f"api{len(self.api_urls)}" if self.api_urls else "api"
        argv = [*_service(), "api", "--port", str(port), "--workers", str(processes)]
        child = self.supervisor.start(name, argv)
        # Named now, so that another API launched before this one is ready
        # is ``api1``.
        self.api_urls[name] = url

        def started() -> None:
            if self.api is None:
                self.api, self.api_url = child, url

        return _Starting(child, lambda: _status(f"{url}/readyz") == 200, started)

    def start_worker(self, concurrency: int = 2) -> Child:
        return self._await(self._launch_worker(concurrency))

    def _launch_worker(self, concurrency: int = 2) -> _Starting:
        name = f"worker{len(self.workers)}"
        child = self.supervisor.start(
            name,
            [*_workers(), "worker", "--concurrency", str(concurrency), "--loglevel", "WARNING"],
        )
        self.workers.append(child)
        return _Starting(child, lambda: "ready." in child.output() or _celery_up(child))

    def start_scheduler(self, standby: bool = False) -> Child:
        """A scheduler: the leader (ready once it leads), or with ``standby`` a
        second one beside it (``scheduler1``, …; ready once its metrics answer,
        not leading), which takes the lead when the leader dies. The first
        stays ``scheduler`` / ``metrics_url``."""
        return self._await(self._launch_scheduler(standby))

    def _launch_scheduler(self, standby: bool = False) -> _Starting:
        port = free_port()
        metrics = f"http://127.0.0.1:{port}/metrics"
        name = f"scheduler{len(self.scheduler_metrics)}" if self.scheduler_metrics else "scheduler"
        child = self.supervisor.start(name, [*_workers(), "scheduler", "--metrics-port", str(port)])
        leading = 0 if standby else 1
        self.scheduler_metrics[name] = metrics

        def started() -> None:
            if self.scheduler is None:
                self.scheduler, self.metrics_url = child, metrics

        return _Starting(child, lambda: _metric(metrics, "qm_admission_leader") == leading, started)

    def start_services(
        self, api_processes: int = 1, workers: int = 1, concurrency: int = 2
    ) -> None:
        """The API, ``workers`` Celery workers and the scheduler, started side
        by side (none needs another to start)."""
        self._await_all(self._launch_services(api_processes, workers, concurrency))

    def _launch_services(
        self, api_processes: int, workers: int, concurrency: int
    ) -> list[_Starting]:
        return [
            self._launch_api(api_processes),
            *(self._launch_worker(concurrency) for _ in range(workers)),
            self._launch_scheduler(),
        ]

    def leaders(self) -> list[Child]:
        """The live schedulers that say they lead admission (one, but for a
        moment during a takeover)."""
        live = {c.name: c for c in self.supervisor.children if c.alive}
        return [
            live[name]
            for name, url in self.scheduler_metrics.items()
            if name in live and _metric(url, "qm_admission_leader") == 1
        ]

    def start(
        self,
        fleet: Path,
        clusters: int,
        manifests: Iterable[Mapping[str, Any]],
        *,
        time_scale: float = 0.01,
        workers: int = 1,
        concurrency: int = 2,
        api_processes: int = 1,
        controllers: bool = True,
    ) -> None:
        """Everything, then the quotas and the stand-ins' Cluster objects
        through the API; returns once every cluster reports Ready. The parts
        start side by side: none needs another to start."""
        members = self._launch_clusters(fleet, clusters, time_scale, controllers)
        self._await_all([members, *self._launch_services(api_processes, workers, concurrency)])
        with self.client() as api:
            for obj in manifests:
                self.create(api, obj)
            registered = register_clusters(api, self.members)
            assert not registered.failed, registered.failed
        wait_until(self.clusters_ready, 60, "member clusters Ready")

    def _await_all(self, parts: Iterable[_Starting]) -> None:
        for part in parts:
            self._await(part)

    def _await(self, part: _Starting, timeout: float = LONG_CEILING) -> Child:
        """``part``'s process, once ready (its ``started`` done)."""
        child = part.child
        deadline = time.monotonic() + timeout
        while not part.ready():
            if not child.alive:
                raise RuntimeError(f"{child.name} exited:\n{child.tail(40)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{child.name} not ready in {timeout} s:\n{child.tail(40)}")
            time.sleep(0.1)
        if part.started is not None:
            part.started()
        return child

    def stop(self) -> None:
        self.supervisor.stop(grace=10)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- talking to it -------------------------------------------------------------------

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(
            base_url=self.api_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=timeout
        )

    @staticmethod
    def create(api: httpx.Client, obj: Mapping[str, Any]) -> None:
        paths = {
            "Topology": "/v1/topologies",
            "ResourceFlavor": "/v1/resourceflavors",
            "Cohort": "/v1/cohorts",
            "WorkloadPriorityClass": "/v1/workloadpriorityclasses",
            "ClusterQueue": "/v1/clusterqueues",
            "LocalQueue": "/v1/namespaces/{ns}/localqueues",
        }
        namespace = (obj.get("metadata") or {}).get("namespace", "")
        response = api.post(paths[str(obj["kind"])].format(ns=namespace), json=dict(obj))
        assert response.status_code == 201, response.text

    def clusters_ready(self) -> bool:
        with self.client() as api:
            items = api.get("/v1/clusters").json().get("items") or []
        return len(items) == len(self.members) and all(
            (c.get("status") or {}).get("state") == "Ready"
            and ((c.get("status") or {}).get("inventory") or {}).get("nodes")
            for c in items
        )

    def metric(self, name: str) -> float | None:
        return _metric(self.metrics_url, name)

    def logs(self, lines: int = 30) -> str:
        """The end of every child's log (for a failing test's message)."""
        return "\n".join(
            f"--- {c.name} ({'alive' if c.alive else c.process.returncode}):\n{c.tail(lines)}"
            for c in self.supervisor.children
        )


def _metric(url: str, name: str) -> float | None:
    """The first sample of ``name`` at a metrics URL (None if it does not answer)."""
    try:
        text = httpx.get(url, timeout=2).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.HTTPError:
        return None


def _celery_up(child: Child) -> bool:
    # At --loglevel=WARNING Celery prints no "ready."; its banner ends with the queue.
    return "[queues]" in child.output() and ".> quartermaster" in child.output()
