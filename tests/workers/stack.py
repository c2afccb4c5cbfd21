"""The whole of Quartermaster as processes, for end-to-end tests and bench/e2e.py.

What standalone mode runs (service/runtime/standalone.py), started with its
supervisor (service/runtime/supervisor.py): the API (``python -m service
api``), Celery workers and the scheduler (``python -m workers.cli worker |
scheduler``) and stand-in member clusters (``python -m sim.cli cluster``,
their simulated time scaled so that jobs run for seconds). Quotas and the
stand-ins' Cluster objects go in through the API, as standalone seeds them.

Besides: a private Postgres (``pg_ctl`` on a data directory of ours) and a
private ``redis-server``, on free ports, that a chaos test may stop and start
without touching the servers other tests share; and :class:`MemberWatch`,
which follows the stand-ins' Jobs, Pods and Nodes through the official
client's watches, so that a test checks what the member clusters really
ran, where and when.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import yaml
from kubernetes import watch

from service.runtime.demo import StandIn, register_clusters, stand_ins
from service.runtime.embedded import free_port
from service.runtime.supervisor import Child, Supervisor
from tests.waiting import LONG_CEILING
from tests.waiting import wait_for as wait_until

ROOT = Path(__file__).resolve().parents[2]
GPU = "nvidia.com/gpu"
ISLAND = "example.com/fabric-block"
ADMISSION_LABEL = "quartermaster.dev/admission"
WORKLOAD_LABEL = "quartermaster.dev/workload"
TOKEN = "e2e-admin-token"


# --- private servers ------------------------------------------------------------------------


def _as_postgres() -> list[str]:
    """initdb and postgres refuse to run as root: run them as ``postgres``."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


class PrivatePostgres:
    """A Postgres server of our own (``pg_ctl``), which a test may stop and start."""

    def __init__(self, root: Path, durable: bool = False) -> None:
        self.root = root
        #: Commits flushed as the service asks (``synchronous_commit`` on), so
        #: that a crash (``stop("immediate")``) loses nothing acknowledged;
        #: ``fsync`` stays off, since a crash of the server keeps what it wrote.
        self.durable = durable
        self.data = root / "pgdata"
        self.log = root / "postgres.log"
        self.port = free_port()
        self.server_url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *argv: str) -> None:
        subprocess.run(
            [*_as_postgres(), *argv], check=True, capture_output=True, timeout=120, cwd=self.root
        )

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c fsync=off -c full_page_writes=off -c max_connections=200"
            f" -c synchronous_commit={'on' if self.durable else 'off'}"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """``fast`` disconnects everyone and shuts down cleanly; ``immediate``
        is a crash (recovery at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()


@contextmanager
def private_postgres(durable: bool = False) -> Iterator[PrivatePostgres]:
    root = Path(tempfile.mkdtemp(prefix="qm-e2e-pg-"))
    server = PrivatePostgres(root, durable)
    try:
        server.init()
        server.start()
        yield server
    finally:
        if server.running():
            with contextlib.suppress(subprocess.SubprocessError):
                server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


class PrivateRedis:
    """A ``redis-server`` of our own without persistence: a restart loses
    everything it held, as the workers must survive."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.root / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [
                "redis-server",
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.root)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        import redis

        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            wait_until(lambda: _pings(client), 60, "redis-server")
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    root = Path(tempfile.mkdtemp(prefix="qm-e2e-redis-"))
    server = PrivateRedis(root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


# --- fleets ---------------------------------------------------------------------------------


def fleet_yaml(clusters: Mapping[str, tuple[int, int]], flavor: str = "h100") -> str:
    """A fleet of 8-GPU nodes: ``{cluster: (islands, nodes per island)}``."""
    groups = "".join(
        f"""  - name: {name}
    nodeGroups:
      - flavor: {flavor}
        islands: {islands}
        nodesPerIsland: {nodes}
        allocatable: {{cpu: 96, memory: 1Ti, {GPU}: 8}}
"""
        for name, (islands, nodes) in clusters.items()
    )
    return f"""topologies:
  - name: fabric
    levels:
      - nodeLabel: {ISLAND}
      - nodeLabel: kubernetes.io/hostname
resourceFlavors:
  - name: {flavor}
    nodeLabels: {{example.com/gpu: {flavor}}}
    topologyName: fabric
clusters:
{groups}"""


def manifest(kind: str, name: str, spec: Mapping[str, Any], namespace: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": kind,
        "metadata": meta,
        "spec": dict(spec),
    }


def team_queue(
    name: str,
    gpus: int,
    *,
    cohort: str = "research",
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    preemption: Mapping[str, Any] | None = None,
    flavor: str = "h100",
) -> dict[str, Any]:
    """A team's ClusterQueue: ``gpus`` GPUs of ``flavor`` (cpu and memory in
    proportion, never the limit), in ``cohort``."""
    gpu: dict[str, Any] = {"name": GPU, "nominalQuota": gpus}
    if borrowing_limit is not None:
        gpu["borrowingLimit"] = borrowing_limit
    if lending_limit is not None:
        gpu["lendingLimit"] = lending_limit
    return manifest(
        "ClusterQueue",
        name,
        {
            "cohortName": cohort,
            "namespaceSelector": {},
            "preemption": dict(preemption or {}),
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", GPU],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": 12 * gpus},
                                {"name": "memory", "nominalQuota": f"{128 * gpus}Gi"},
                                gpu,
                            ],
                        }
                    ],
                }
            ],
        },
    )


def base_manifests(flavor: str = "h100") -> list[dict[str, Any]]:
    return [
        manifest(
            "Topology",
            "fabric",
            {"levels": [{"nodeLabel": ISLAND}, {"nodeLabel": "kubernetes.io/hostname"}]},
        ),
        manifest(
            "ResourceFlavor",
            flavor,
            {"nodeLabels": {"example.com/gpu": flavor}, "topologyName": "fabric"},
        ),
        manifest("Cohort", "research", {}),
    ]


def local_queue(namespace: str, cluster_queue: str, name: str = "train") -> dict[str, Any]:
    return manifest("LocalQueue", name, {"clusterQueue": cluster_queue}, namespace)


def pod_template(requests: Mapping[str, Any], duration: str | None = None) -> dict[str, Any]:
    """A training pod that passes the security floor (image by digest, its own
    service account, a runtime class), asking for ``requests``; the stand-in's
    kubelet runs it ``duration`` of simulated time (its default without)."""
    template: dict[str, Any] = {
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": "trainer",
            "runtimeClassName": "nvidia",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "image": "registry.example/train@sha256:" + "a" * 64,
                    "resources": {"requests": dict(requests)},
                }
            ],
        }
    }
    if duration is not None:
        template["metadata"] = {"annotations": {"quartermaster.dev/sim-duration": duration}}
    return template


def gang(
    name: str, gpus: int, seconds: float, *, queue: str = "train", priority: int | None = None
) -> dict[str, Any]:
    """A training gang of ``gpus`` GPUs (pods of at most 8), running
    ``seconds`` of simulated time; more than one pod asks for one island."""
    per_pod = min(gpus, 8)
    if gpus > 8 and gpus % 8:
        raise ValueError("a gang of more than 8 GPUs has whole nodes")
    count = max(1, gpus // 8)
    pod_set: dict[str, Any] = {
        "name": "workers",
        "count": count,
        "template": pod_template(
            {"cpu": str(per_pod), "memory": f"{8 * per_pod}Gi", GPU: per_pod}, f"{seconds:g}s"
        ),
    }
    if count > 1:
        pod_set["topologyRequest"] = {"required": ISLAND}
    spec: dict[str, Any] = {"queueName": queue, "podSets": [pod_set]}
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": spec,
    }


# --- the processes --------------------------------------------------------------------------

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
        env = dict(os.environ)
        env.update(
            PYTHONUNBUFFERED="1",
            PYTHONPATH=str(ROOT),
            QM_DATABASE_URL=self.database_url,
            QM_BROKER_URL=self.broker_url,
            QM_BOOTSTRAP_TOKEN=TOKEN,
            QM_SECRET_KEY="e2e-secret-key-e2e-secret-key-0123",
            QM_DATA_DIR=str(self.workdir),
        )
        env.update(self.env)
        self.supervisor = Supervisor(self.workdir / "logs", env)

    # -- starting ------------------------------------------------------------------------

    def start_clusters(
        self, fleet: Path, count: int, time_scale: float, controllers: bool = True
    ) -> None:
        """``controllers=False``: API servers only (no scheduler, kubelet or
        Kueue): jobs are stored and nothing runs them."""
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
        self._ready(child, lambda: "kubeconfig written" in child.output())
        self.members = stand_ins(self.kubeconfig)

    def start_api(self, processes: int = 1, port: int | None = None) -> Child:
        """An API process (``processes`` uvicorn workers). Called again, another
        one beside it (``api1``, …), on ``port`` if given (a killed one's, so
        that its clients find the new one where they knew the old); the first
        stays ``api`` / ``api_url``."""
        port = port or free_port()
        url = f"http://127.0.0.1:{port}"
        name = f"api{len(self.api_urls)}" if self.api_urls else "api"
        argv = [*_service(), "api", "--port", str(port), "--workers", str(processes)]
        child = self.supervisor.start(name, argv)
        self._ready(child, lambda: _status(f"{url}/readyz") == 200)
        self.api_urls[name] = url
        if self.api is None:
            self.api, self.api_url = child, url
        return child

    def start_worker(self, concurrency: int = 2) -> Child:
        name = f"worker{len(self.workers)}"
        child = self.supervisor.start(
            name,
            [*_workers(), "worker", "--concurrency", str(concurrency), "--loglevel", "WARNING"],
        )
        self._ready(child, lambda: "ready." in child.output() or _celery_up(child))
        self.workers.append(child)
        return child

    def start_scheduler(self, standby: bool = False) -> Child:
        """A scheduler: the leader (ready once it leads), or with ``standby`` a
        second one beside it (``scheduler1``, …; ready once its metrics answer,
        not leading), which takes the lead when the leader dies. The first
        stays ``scheduler`` / ``metrics_url``."""
        port = free_port()
        metrics = f"http://127.0.0.1:{port}/metrics"
        name = f"scheduler{len(self.scheduler_metrics)}" if self.scheduler_metrics else "scheduler"
        child = self.supervisor.start(name, [*_workers(), "scheduler", "--metrics-port", str(port)])
        leading = 0 if standby else 1
        self._ready(child, lambda: _metric(metrics, "qm_admission_leader") == leading)
        self.scheduler_metrics[name] = metrics
        if self.scheduler is None:
            self.scheduler, self.metrics_url = child, metrics
        return child

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
        through the API; returns once every cluster reports Ready."""
        self.start_clusters(fleet, clusters, time_scale, controllers)
        self.start_api(api_processes)
        for _ in range(workers):
            self.start_worker(concurrency)
        self.start_scheduler()
        with self.client() as api:
            for obj in manifests:
                self.create(api, obj)
            registered = register_clusters(api, self.members)
            assert not registered.failed, registered.failed
        wait_until(self.clusters_ready, 60, "member clusters Ready")

    def _ready(
        self, child: Child, check: Callable[[], bool], timeout: float = LONG_CEILING
    ) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if not child.alive:
                raise RuntimeError(f"{child.name} exited:\n{child.tail(40)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{child.name} not ready in {timeout} s:\n{child.tail(40)}")
            time.sleep(0.1)

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


# --- what the member clusters ran -----------------------------------------------------------


@dataclass
class PodRecord:
    cluster: str
    namespace: str
    name: str
    workload: str
    admission: str
    gpus: int
    node: str | None = None
    phases: set[str] = field(default_factory=set)
    created: float = 0.0
    deleted: float | None = None
    #: (wall time, event, phase, node, resourceVersion, terminating) of every event seen.
    history: list[tuple[float, str, str, str | None, str, bool]] = field(default_factory=list)


@dataclass
class JobRecord:
    cluster: str
    namespace: str
    name: str
    admission: str
    uid: str
    created: float
    deleted: float | None = None


def _gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or ():
        requests = (container.get("resources") or {}).get("requests") or {}
        total += int(requests.get(GPU, 0))
    return total


class MemberWatch:
    """Follows Jobs and Pods on every stand-in through watches (resumed
    after a break), keeping every pod and job ever seen and checking, at
    every pod event, that no node holds more GPUs than it has."""

    def __init__(self, members: Iterable[StandIn], kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.members = list(members)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.pods: dict[tuple[str, str, str], PodRecord] = {}
        self.jobs: dict[tuple[str, str, str], JobRecord] = {}
        #: Every job object ever created, in the order seen.
        self.job_history: list[JobRecord] = []
        self.node_island: dict[tuple[str, str], str] = {}
        self.node_gpus: dict[tuple[str, str], int] = {}
        self.overcommits: list[str] = []
        self.errors: list[str] = []
        self.on_job: Callable[[JobRecord], None] | None = None
        self._bound: dict[tuple[str, str], dict[tuple[str, str, str], int]] = {}
        self._threads: list[threading.Thread] = []
        self._synced: set[tuple[str, str]] = set()

    def _client(self, member: StandIn) -> Any:
        """The official client's ApiClient for ``member`` (untyped library)."""
        new_client: Any = kubernetes.config.new_client_from_config
        return new_client(config_file=str(self.kubeconfig), context=member.name)

    def start(self) -> MemberWatch:
        for member in self.members:
            with self._client(member) as api:
                nodes: Any = kubernetes.client.CoreV1Api(api).list_node(_preload_content=False)
                for node in json.loads(nodes.data)["items"]:
                    key = (member.name, node["metadata"]["name"])
                    self.node_island[key] = (node["metadata"].get("labels") or {}).get(ISLAND, "")
                    self.node_gpus[key] = int(node["status"]["allocatable"].get(GPU, 0))
            for kind in ("pods", "jobs"):
                thread = threading.Thread(
                    target=self._follow,
                    args=(member, kind),
                    daemon=True,
                    name=f"{member.name}-{kind}",
                )
                thread.start()
                self._threads.append(thread)
        wait_until(lambda: len(self._synced) == 2 * len(self.members), 60, "member watches")
        return self

    def close(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(10)

    def __enter__(self) -> MemberWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _follow(self, member: StandIn, kind: str) -> None:
        api = self._client(member)
        lister: Any
        if kind == "pods":
            lister = kubernetes.client.CoreV1Api(api).list_pod_for_all_namespaces
        else:
            lister = kubernetes.client.BatchV1Api(api).list_job_for_all_namespaces
        selector = ADMISSION_LABEL
        version = None
        try:
            while not self.stop.is_set():
                try:
                    if version is None:
                        listed = json.loads(
                            lister(label_selector=selector, _preload_content=False).data
                        )
                        self._relisted(member.name, kind, listed["items"])
                        version = listed["metadata"]["resourceVersion"]
                        self._synced.add((member.name, kind))
                    watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
                    stream = watcher.stream(
                        lister,
                        label_selector=selector,
                        resource_version=version,
                        allow_watch_bookmarks=True,
                        timeout_seconds=5,
                        deserialize=False,
                        _request_timeout=(2, 15),
                    )
                    for event in stream:
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            if obj.get("code") == 410:
                                version = None
                                break
                            raise RuntimeError(f"watch error: {obj}")
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self._seen(member.name, kind, event["type"], obj)
                        if self.stop.is_set():
                            break
                except kubernetes.client.exceptions.ApiException as error:
                    if error.status == 410:
                        version = None  # too old: list again
                    else:
                        self._error(member.name, kind, error)
                        self.stop.wait(0.5)
                except Exception as error:  # a broken stream: resume where it was
                    self._error(member.name, kind, error)
                    self.stop.wait(0.5)
        finally:
            api.close()

    def _relisted(self, cluster: str, kind: str, items: list[dict[str, Any]]) -> None:
        """A fresh list (at the start, or after the watch fell too far
        behind): what is no longer there was deleted meanwhile."""
        listed = {(cluster, o["metadata"]["namespace"], o["metadata"]["name"]) for o in items}
        now = time.time()
        with self.lock:
            known = self.pods if kind == "pods" else self.jobs
            for key, record in known.items():
                if key[0] == cluster and key not in listed and record.deleted is None:
                    record.deleted = now
                    if isinstance(record, PodRecord):
                        self._account(cluster, (key[1], key[2]), record, live=False)
        for obj in items:
            self._seen(cluster, kind, "ADDED", obj)

    def _error(self, cluster: str, kind: str, error: Exception) -> None:
        with self.lock:
            self.errors.append(f"{cluster} {kind}: {type(error).__name__}: {error}"[:300])

    def _seen(self, cluster: str, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        now = time.time()  # wall clock: compared with what Postgres records
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        key = (cluster, namespace, name)
        with self.lock:
            if kind == "jobs":
                job = self.jobs.get(key)
                if job is None or job.uid != uid:
                    admission = labels.get(ADMISSION_LABEL, "")
                    job = JobRecord(cluster, namespace, name, admission, uid, now)
                    self.jobs[key] = job
                    self.job_history.append(job)
                    if self.on_job is not None:
                        self.on_job(job)
                if event == "DELETED":
                    job.deleted = now
                return
            pod = self.pods.get(key)
            if pod is None or pod.admission != labels.get(ADMISSION_LABEL, ""):
                pod = PodRecord(
                    cluster,
                    namespace,
                    name,
                    labels.get(WORKLOAD_LABEL, ""),
                    labels.get(ADMISSION_LABEL, ""),
                    _gpus(obj),
                    created=now,
                )
                self.pods[key] = pod
            phase = (obj.get("status") or {}).get("phase") or "Pending"
            pod.phases.add(phase)
            node = (obj.get("spec") or {}).get("nodeName")
            if node:
                pod.node = node
            pod.history.append(
                (
                    now,
                    event,
                    phase,
                    node,
                    meta["resourceVersion"],
                    bool(meta.get("deletionTimestamp")),
                )
            )
            live = event != "DELETED" and phase not in ("Succeeded", "Failed")
            if event == "DELETED":
                pod.deleted = now
            self._account(cluster, (namespace, name), pod, live)

    def _account(self, cluster: str, key: tuple[str, str], pod: PodRecord, live: bool) -> None:
        ref = (cluster, *key)
        for node_pods in self._bound.values():
            node_pods.pop(ref, None)
        if not live or pod.node is None:
            return
        node = (cluster, pod.node)
        bound = self._bound.setdefault(node, {})
        bound[ref] = pod.gpus
        used = sum(bound.values())
        if used > self.node_gpus.get(node, 0):
            holders = "; ".join(f"{k[2]} {self.pods[k].history}" for k in bound)
            self.overcommits.append(f"{cluster}/{pod.node}: {used} GPUs bound to {holders}")

    # -- questions -----------------------------------------------------------------------

    def listed(self) -> dict[str, set[tuple[str, str, str]]]:
        """What the members hold now, by a fresh list (not the watches):
        ``{"pods": {(cluster, namespace, name)}, "jobs": {...}}``."""
        out: dict[str, set[tuple[str, str, str]]] = {"pods": set(), "jobs": set()}
        for member in self.members:
            with self._client(member) as api:
                for kind, lister in (
                    ("pods", kubernetes.client.CoreV1Api(api).list_pod_for_all_namespaces),
                    ("jobs", kubernetes.client.BatchV1Api(api).list_job_for_all_namespaces),
                ):
                    raw: Any = lister(label_selector=ADMISSION_LABEL, _preload_content=False)
                    for obj in json.loads(raw.data)["items"]:
                        meta = obj["metadata"]
                        out[kind].add((member.name, meta["namespace"], meta["name"]))
        return out

    def unseen(self) -> list[str]:
        """Where the watches disagree with a fresh list (events missed)."""
        listed = self.listed()
        with self.lock:
            alive = {
                "pods": {k for k, p in self.pods.items() if p.deleted is None},
                "jobs": {k for k, j in self.jobs.items() if j.deleted is None},
            }
        said = {True: "listed, not watched", False: "watched, not listed"}
        return [
            f"{kind} {key}: {said[key in listed[kind]]}"
            for kind in ("pods", "jobs")
            for key in sorted(listed[kind] ^ alive[kind])
        ]

    def pods_of(self, workload: str) -> list[PodRecord]:
        """Every pod seen of a workload (``namespace.name`` label)."""
        with self.lock:
            return [p for p in self.pods.values() if p.workload == workload]

    def straddlers(self) -> list[str]:
        """Admissions whose pods ran in more than one island (or cluster)."""
        islands: dict[str, set[tuple[str, str]]] = {}
        with self.lock:
            for pod in self.pods.values():
                if pod.node is not None:
                    island = self.node_island.get((pod.cluster, pod.node), "?")
                    islands.setdefault(pod.admission, set()).add((pod.cluster, island))
        return sorted(f"{a}: {sorted(i)}" for a, i in islands.items() if len(i) > 1)


def write_fleet(path: Path, clusters: Mapping[str, tuple[int, int]]) -> Path:
    path.write_text(fleet_yaml(clusters))
    yaml.safe_load(path.read_text())  # well-formed
    return path
