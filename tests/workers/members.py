"""Member clusters for the reconcile and sync tests: stand-in API servers
(sim/kubesim) served over HTTPS, registered centrally as Cluster objects with
their token and CA, and a small fleet of h100 islands."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from service.app.bootstrap import Services
from sim.kubesim.testing import RunningCluster, running_clusters
from tests.workers.conftest import ADMIN, GPU, worker_settings
from tests.workers.stack import pod_template
from workers.outbox import Send
from workers.scheduler import Scheduler
from workers.settings import WorkerSettings

ISLAND = "example.com/fabric-block"
FLEET = """
topologies:
  - name: fabric
    levels:
      - nodeLabel: example.com/fabric-block
      - nodeLabel: kubernetes.io/hostname
resourceFlavors:
  - name: h100
    nodeLabels: {example.com/gpu: h100}
    topologyName: fabric
clusters:
""" + "".join(
    f"""  - name: {name}
    nodeGroups:
      - flavor: h100
        islands: 2
        nodesPerIsland: 2
        allocatable: {{cpu: 96, memory: 1Ti, nvidia.com/gpu: 8}}
"""
    for name in ("c1", "c2")
)


@contextmanager
def members(
    tmp_path: Path,
    names: tuple[str, ...] = ("c1",),
    backend: str | None = None,
    extra_objects: Sequence[dict[str, Any]] = (),
) -> Iterator[list[RunningCluster]]:
    """``backend``: ``volcano`` serves Volcano's CRDs and scheduler instead of
    Kueue's; ``extra_objects``: created on each member at its start."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    with running_clusters(
        fleet,
        names,
        time_scale=0.01,
        bookmark_interval=0.5,
        backend=backend,
        extra_objects=extra_objects,
    ) as clusters:
        yield clusters


def setup_central(
    services: Services,
    clusters: list[RunningCluster],
    *,
    gpu_quota: int = 32,
    preemption: dict[str, Any] | None = None,
) -> None:
    """The fleet's flavor and topology, ClusterQueue ``cq``, LocalQueue
    ``train`` in ``team-a``, and one Cluster per stand-in."""
    create = services.resources.create
    create(
        ADMIN,
        "topologies",
        "",
        {
            "metadata": {"name": "fabric"},
            "spec": {"levels": [{"nodeLabel": ISLAND}, {"nodeLabel": "kubernetes.io/hostname"}]},
        },
    )
    create(
        ADMIN,
        "resourceflavors",
        "",
        {
            "metadata": {"name": "h100"},
            "spec": {"nodeLabels": {"example.com/gpu": "h100"}, "topologyName": "fabric"},
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
    create(
        ADMIN,
        "localqueues",
        "team-a",
        {"metadata": {"name": "train"}, "spec": {"clusterQueue": "cq"}},
    )
    for cluster in clusters:
        create(ADMIN, "clusters", "", cluster_body(cluster))


def cluster_body(cluster: RunningCluster) -> dict[str, Any]:
    """The Cluster object that registers the stand-in ``cluster``."""
    assert cluster.ca_file is not None
    return {
        "metadata": {"name": cluster.name},
        "spec": {
            "server": cluster.url,
            "caData": cluster.ca_file.read_text(),
            "credentials": {"token": cluster.token},
        },
    }


def gang(
    name: str, count: int = 2, gpus: int = 8, duration: str = "200s", **spec: Any
) -> dict[str, Any]:
    """A gang that wants one island, running ``duration`` of simulated time."""
    template = pod_template({"cpu": "8", "memory": "64Gi", GPU: gpus}, duration)
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "queueName": "train",
            "podSets": [
                {
                    "name": "workers",
                    "count": count,
                    "template": template,
                    "topologyRequest": {"required": ISLAND},
                }
            ],
            **spec,
        },
    }


def settings(database_url: str, broker: str, **overrides: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "cycle_interval": 0.25,
        "resync_interval": 0.25,
        "heartbeat_interval": 0.5,
        "cluster_lease": 60.0,
        "delete_wait": 10.0,
        "member_connect_timeout": 1.0,
        "member_read_timeout": 5.0,
    }
    values.update(overrides)
    return worker_settings(database_url, broker, **values)


@contextmanager
def scheduling(
    engine: sa.Engine, settings: WorkerSettings, send: Send, relay: bool = False
) -> Iterator[Scheduler]:
    """The admission leader and the fleet loop in a thread of this process."""
    scheduler = Scheduler(engine, settings, send, holder="test", relay=relay)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        yield scheduler
    finally:
        scheduler.stop.set()
        thread.join(15)


def jobs(cluster: RunningCluster) -> list[dict[str, Any]]:
    """The Jobs in the stand-in's store (no HTTP)."""

    def read() -> list[dict[str, Any]]:
        resource = cluster.cluster.core.for_kind("batch/v1", "Job")
        return [dict(o) for o in cluster.cluster.store.items(resource.rtype)]

    return cluster.run(read)


def job(cluster: RunningCluster, name: str, namespace: str = "team-a") -> dict[str, Any] | None:
    return cluster.get("batch/v1", "Job", namespace, name)


def ledger(engine: sa.Engine, kind: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [
            dict(body)
            for body in conn.exec_driver_sql(
                "SELECT body FROM ledger_entries WHERE kind = %(kind)s ORDER BY seq", {"kind": kind}
            ).scalars()
        ]


def watch_jobs(cluster: RunningCluster, stop: threading.Event) -> Callable[[], list[set[str]]]:
    """Sample the set of job names on ``cluster`` until ``stop``; returns a
    getter of the samples."""
    samples: list[set[str]] = []

    def loop() -> None:
        while not stop.is_set():
            samples.append({j["metadata"]["name"] for j in jobs(cluster)})
            stop.wait(0.02)

    threading.Thread(target=loop, daemon=True).start()
    return lambda: samples
