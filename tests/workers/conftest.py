"""Workers against real Postgres, Redis and Celery worker processes.

``celery_worker`` starts ``celery worker`` as a subprocess in its own process
group (prefork, one pool process) with ``tests.workers.probe`` loaded, and
kills the whole group afterwards. Timeouts are shortened so that a test sees a
retry or a dead letter in seconds.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import redis
import sqlalchemy as sa
from celery import Celery

from service.app.auth import Principal, Role
from service.app.bootstrap import Services, bootstrap
from service.app.resources import Actor, stream_name
from service.config import Settings
from service.eventstore.port import EventMetadata, NewEvent
from service.projections.resources import resource_row, upsert_resources
from service.projections.schema import resources
from tests.waiting import LONG_CEILING, wait_for
from workers.celery_app import make_celery
from workers.outbox import Send
from workers.settings import WorkerSettings
from workers.tasks import sender

ROOT = Path(__file__).resolve().parents[2]
ADMIN = Actor(Principal("test-admin", frozenset({Role.ADMIN}), frozenset({"*"})))
GPU = "nvidia.com/gpu"
TEST_ENV = {
    "QM_VISIBILITY_TIMEOUT": "20",
    "QM_TASK_TIME_LIMIT": "15",
    "QM_RETRY_BACKOFF_MAX": "0.5",
    "QM_MAX_DELIVERIES": "3",
}


def worker_settings(database_url: str, redis_url: str, **overrides: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "broker_url": redis_url,
        "visibility_timeout": 20.0,
        "task_time_limit": 15.0,
        "retry_backoff_max": 0.5,
        "max_deliveries": 3,
        "cycle_interval": 1.0,
        "relay_poll_interval": 0.5,
    }
    values.update(overrides)
    return WorkerSettings(**values)


@pytest.fixture
def broker(redis_url: str) -> Iterator[str]:
    """The test process' Redis db, emptied before and after the test."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield redis_url
    client.flushdb()
    client.close()


@pytest.fixture
def celery_client(broker: str, database_url: str) -> Iterator[Celery]:
    celery = make_celery(worker_settings(database_url, broker))
    yield celery
    celery.close()


@pytest.fixture
def send(celery_client: Celery) -> Send:
    return sender(celery_client)


@contextmanager
def celery_worker(
    database_url: str, redis_url: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``env``: more QM_ settings for the worker (a key rotation's, say)."""
    log = tempfile.NamedTemporaryFile(prefix="qm-celery-", suffix=".log", delete=False)  # noqa: SIM115
    env = {
        **os.environ,
        **TEST_ENV,
        "QM_DATABASE_URL": database_url,
        "QM_BROKER_URL": redis_url,
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.celery_app:app",
        "worker",
        "--pool=prefork",
        "--concurrency=1",
        "--include=tests.workers.probe",
        "--queues=quartermaster",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel=INFO",
    ]
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_for(
            lambda: b"ready." in Path(log.name).read_bytes() or proc.poll() is not None,
            LONG_CEILING,
            "the Celery worker ready",
        )
        if proc.poll() is not None:
            raise RuntimeError(Path(log.name).read_text())
        yield proc
    finally:
        with _suppress():
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with _suppress():
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        # Pool processes share the group; make sure none outlives the test.
        with _suppress():
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        os.unlink(log.name)


def _suppress() -> contextlib.suppress:
    return contextlib.suppress(ProcessLookupError, PermissionError)


@pytest.fixture
def services(engine: sa.Engine, database_url: str) -> Iterator[Services]:
    built = bootstrap(Settings(database_url=database_url, db_pool_size=4))
    yield built
    built.close()


# -- admin objects ------------------------------------------------------------------------


def gpu_pod(gpus: int = 8) -> dict[str, Any]:
    return {
        "spec": {
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
                    "resources": {"requests": {"cpu": "8", "memory": "64Gi", GPU: gpus}},
                }
            ],
        }
    }


def workload(
    name: str, count: int = 1, gpus: int = 8, island: bool = False, **spec: Any
) -> dict[str, Any]:
    pod_set: dict[str, Any] = {"name": "workers", "count": count, "template": gpu_pod(gpus)}
    if island:
        pod_set["topologyRequest"] = {"required": "example.com/fabric-block"}
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {"queueName": "train", "podSets": [pod_set], **spec},
    }


def setup_fleet(
    services: Services,
    *,
    gpu_quota: int = 16,
    namespaces: tuple[str, ...] = ("team-a",),
    preemption: dict[str, Any] | None = None,
    islands: int = 2,
    nodes_per_island: int = 2,
) -> None:
    """Flavor h100 on a topology, one ClusterQueue ``cq`` (GPU quota as
    given), LocalQueue ``train`` per namespace, cluster ``c1`` whose
    inventory has ``islands`` x ``nodes_per_island`` nodes of 8 GPUs."""
    create = services.resources.create
    create(
        ADMIN,
        "topologies",
        "",
        {
            "metadata": {"name": "fabric"},
            "spec": {
                "levels": [
                    {"nodeLabel": "example.com/fabric-block"},
                    {"nodeLabel": "kubernetes.io/hostname"},
                ]
            },
        },
    )
    create(
        ADMIN,
        "resourceflavors",
        "",
        {
            "metadata": {"name": "h100"},
            "spec": {"nodeLabels": {"sku": "h100"}, "topologyName": "fabric"},
        },
    )
    create(
        ADMIN,
        "clusterqueues",
        "",
        {
            "metadata": {"name": "cq"},
            "spec": {
                "namespaceSelector": {},
                "preemption": preemption or {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", GPU],
                        "flavors": [
                            {
                                "name": "h100",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": 1024},
                                    {"name": "memory", "nominalQuota": "8Ti"},
                                    {"name": GPU, "nominalQuota": gpu_quota},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    for ns in namespaces:
        create(
            ADMIN,
            "localqueues",
            ns,
            {"metadata": {"name": "train"}, "spec": {"clusterQueue": "cq"}},
        )
    create(
        ADMIN,
        "clusters",
        "",
        {
            "metadata": {"name": "c1", "labels": {"region": "eu"}},
            "spec": {"server": "https://c1.example:6443", "credentials": {"token": "t"}},
        },
    )
    setup_nodes(services, islands, nodes_per_island)


def setup_nodes(services: Services, islands: int, nodes_per_island: int) -> None:
    """Cluster ``c1``'s inventory: ``islands`` x ``nodes_per_island`` nodes of 8 GPUs."""
    nodes = [
        {
            "name": f"c1-i{i}-n{n}",
            "flavor": "h100",
            "island": f"c1-i{i}",
            "labels": {
                "sku": "h100",
                "example.com/fabric-block": f"c1-i{i}",
                "kubernetes.io/hostname": f"c1-i{i}-n{n}",
            },
            "allocatable": {"cpu": "96", "memory": "1Ti", GPU: 8},
        }
        for i in range(islands)
        for n in range(nodes_per_island)
    ]
    set_cluster_status(services, "c1", {"state": "Ready", "inventory": {"nodes": nodes}})


def set_cluster_status(services: Services, name: str, status: dict[str, Any]) -> None:
    """What sync will do: a Cluster's new state, status included, as an event
    with its read-model row."""
    with services.unit_of_work() as uow:
        row = uow.connection.execute(
            sa.select(resources).where(
                resources.c.kind == "Cluster", resources.c.namespace == "", resources.c.name == name
            )
        ).one()
        data = {
            "kind": "Cluster",
            "namespace": "",
            "name": name,
            "uid": str(row.uid),
            "generation": row.generation,
            "labels": row.labels,
            "annotations": row.annotations,
            "spec": row.spec,
            "status": status,
            "secret": base64.b64encode(row.secret).decode() if row.secret else None,
            "created_at": row.created_at.isoformat(),
        }
        meta = EventMetadata(actor="test:sync", occurred_at=row.updated_at)
        uow.events.append(
            stream_name("Cluster", "", name),
            row.resource_version,
            [NewEvent(uuid4(), "ResourceChanged", data, meta)],
        )
        upsert_resources(
            uow.connection, [resource_row(data, row.resource_version + 1, row.updated_at)]
        )
        uow.commit()


def workload_status(engine: sa.Engine, namespace: str, name: str) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(
            conn.execute(
                sa.select(resources.c.status).where(
                    resources.c.kind == "Workload",
                    resources.c.namespace == namespace,
                    resources.c.name == name,
                )
            ).scalar_one()
        )


DECISIONS = ("workload.admitted", "workload.preempted", "workload.evicted")


def ledger_kinds(engine: sa.Engine) -> list[str]:
    """The admission cycle's ledger entries, in order (the API records others)."""
    with engine.connect() as conn:
        kinds = conn.exec_driver_sql("SELECT kind FROM ledger_entries ORDER BY seq").scalars()
        return [kind for kind in kinds if kind in DECISIONS]
