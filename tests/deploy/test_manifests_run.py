"""The production overlay's manifests run (tests/deploy/kubelet.py starts
their containers as local processes: command, args, environment from the
ConfigMap and the Secrets, ports made local), against a scratch database
of the test Postgres and the test process's own Redis database:

* the init container of a part waits while the schema is not this
  version's; the migration Job applies the migrations; the init container
  then lets its part start;
* two schedulers start and exactly one leads admission;
* as many API processes as the autoscaler's minimum, each on its own port,
  pass their readiness probe (/readyz), and every probe of every part passes;
* a worker passes its Celery-ping probe, which fails before it runs, and
  consumes the reconcile messages of the outbox;
* a workload submitted to each API process runs to Finished on a stand-in
  member registered through the API;
* nothing was written outside the pods' /tmp.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis
import sqlalchemy as sa

from service.ledger.checkpoint import NoteSigner
from service.runtime.demo import register_clusters
from tests.deploy.kubelet import Kubelet, Pod
from tests.deploy.manifests import OVERLAYS, find, render
from tests.harness import scratch_database
from tests.waiting import LONG_CEILING, wait_for
from tests.workers.stack import (
    Stack,
    base_manifests,
    gang,
    local_queue,
    team_queue,
    write_fleet,
)
from workers.reconcile import TOPIC as RECONCILE_TOPIC

TOKEN = "deploy-test-admin-token"


@contextmanager
def _own_redis_db(url: str) -> Iterator[str]:
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


def _secrets(database: str, broker: str) -> dict[str, dict[str, str]]:
    """What the operator puts in production's Secrets (docs/operations.md)."""
    _, seed = NoteSigner.generate("quartermaster.dev/ledger")
    return {
        "quartermaster": {
            "database-url": database,
            "broker-url": broker,
            "secret-key": base64.b64encode(os.urandom(32)).decode(),
            "ledger-signing-key": seed,
            "bootstrap-token": TOKEN,
        },
        "quartermaster-migrate": {"database-url": database},
    }


def _client(kubelet: Kubelet, pod: Pod) -> httpx.Client:
    port = pod.port("http", pod.container("api"))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60)


def _leading(kubelet: Kubelet, pods: list[Pod]) -> list[float | None]:
    values: list[float | None] = []
    for pod in pods:
        port = pod.port("metrics", pod.container("scheduler"))
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            values.append(None)
            continue
        lines = [line for line in text.splitlines() if line.startswith("qm_admission_leader ")]
        values.append(float(lines[0].split()[1]) if lines else None)
    return values


def _one_leads(values: list[float | None]) -> bool:
    """Every scheduler answers, one says it leads and the others that they do not."""
    return values.count(1.0) == 1 and values.count(0.0) == len(values) - 1


def _state(api: httpx.Client, name: str) -> str | None:
    response = api.get(f"/v1/namespaces/team-a/workloads/{name}")
    return ((response.json().get("status") or {}).get("state")) if response.is_success else None


def _consumed(database: str) -> int:
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT count(*) FROM processed_messages WHERE consumer = :c"),
                    {"c": RECONCILE_TOPIC},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_the_rendered_manifests_run(
    postgres_server_url: str, redis_url: str, tmp_path: Path
) -> None:
    objects = render(OVERLAYS["production"])
    workloads = {o["metadata"]["name"]: o for o in objects if o["kind"] in ("Deployment", "Job")}
    api_replicas = find(list(objects), "HorizontalPodAutoscaler", "quartermaster-api")["spec"][
        "minReplicas"
    ]
    scheduler_replicas = workloads["quartermaster-scheduler"]["spec"]["replicas"]
    with (
        scratch_database(postgres_server_url, "deploy") as database,
        _own_redis_db(redis_url) as broker,
    ):
        kubelet = Kubelet(objects, _secrets(database, broker), tmp_path / "pods")
        stack = Stack(tmp_path / "members", database, broker)
        try:
            _run(kubelet, stack, workloads, api_replicas, scheduler_replicas, database, tmp_path)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{kubelet.logs()}\n{stack.logs()}") from error
        finally:
            kubelet.stop()
            stack.stop()


def _run(
    kubelet: Kubelet,
    stack: Stack,
    workloads: dict[str, Any],
    api_replicas: int,
    scheduler_replicas: int,
    database: str,
    tmp_path: Path,
) -> None:
    # Migrations first: a part's init container waits for them.
    early = kubelet.pod(workloads["quartermaster-api"], 0)
    waiting = kubelet.start(early, "wait-for-migrations")
    wait_for(lambda: "not migrated" in waiting.output(), LONG_CEILING, "the init container waiting")
    assert waiting.alive, waiting.tail()
    job = kubelet.pod(workloads["quartermaster-migrate"])
    migrate = kubelet.start(job, "migrate")
    assert migrate.process.wait(LONG_CEILING) == 0, migrate.tail(30)
    assert waiting.process.wait(LONG_CEILING) == 0, waiting.tail()
    for container in early.template["spec"]["containers"]:
        kubelet.start(early, container["name"])

    schedulers = [
        kubelet.pod(workloads["quartermaster-scheduler"], i) for i in range(scheduler_replicas)
    ]
    apis = [early] + [
        kubelet.pod(workloads["quartermaster-api"], i) for i in range(1, api_replicas)
    ]
    worker = kubelet.pod(workloads["quartermaster-worker"])
    for pod in [*schedulers, *apis[1:]]:
        kubelet.start_pod(pod)
    kubelet.run_inits(worker)
    # Before the worker runs, its probe fails: the probe can tell.
    assert not kubelet.probe(worker, "worker", "livenessProbe")
    kubelet.start(worker, "worker")

    for pod in schedulers:
        kubelet.until(pod, "scheduler", "startupProbe")
    for pod in apis:
        kubelet.until(pod, "api", "startupProbe")
        kubelet.until(pod, "api", "readinessProbe")
    kubelet.until(worker, "worker", "startupProbe")
    ports = {pod.port("http", pod.container("api")) for pod in apis}
    assert len(ports) == len(apis) >= 2
    wait_for(
        lambda: _one_leads(_leading(kubelet, schedulers)),
        LONG_CEILING,
        "exactly one scheduler leading",
        seen=lambda: _leading(kubelet, schedulers),
    )

    # A stand-in member, registered through one API; quotas through the other.
    fleet = write_fleet(tmp_path / "fleet.yaml", {"m1": (1, 2)})
    stack.start_clusters(fleet, 1, time_scale=0.01)
    clients = [_client(kubelet, pod) for pod in apis]
    try:
        registered = register_clusters(clients[0], stack.members)
        assert not registered.failed, registered.failed
        for obj in [*base_manifests(), team_queue("team-a", 16), local_queue("team-a", "team-a")]:
            Stack.create(clients[-1], obj)
        for i, api in enumerate(clients):
            response = api.post("/v1/namespaces/team-a/workloads", json=gang(f"w{i}", 8, 30))
            assert response.status_code == 201, response.text
        names = [f"w{i}" for i in range(len(clients))]
        wait_for(
            lambda: all(_state(clients[0], n) == "Finished" for n in names),
            LONG_CEILING,
            "every workload Finished",
            seen=lambda: {n: _state(clients[-1], n) for n in names},
        )
    finally:
        for api in clients:
            api.close()
    wait_for(lambda: _consumed(database) > 0, LONG_CEILING, "the worker consuming reconciles")

    # Every probe of every part passes, and nothing was written but /tmp.
    for pod in [*apis, *schedulers, worker]:
        for container in pod.template["spec"]["containers"]:
            for kind in ("livenessProbe", "readinessProbe"):
                if kind in container:
                    assert kubelet.passes(pod, container["name"], kind), f"{pod.name} {kind}"
    written = [str(p) for pod in kubelet.pods for p in pod.root.rglob("*")]
    assert written == [], "a read-only root filesystem would have refused these"
