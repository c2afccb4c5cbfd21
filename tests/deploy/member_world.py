"""A stand-in member whose workers' token holds exactly the rules that
``deploy/member`` renders, and the real workers against it: the admission
leader with the fleet loop and the outbox relay (a thread of this process)
and a Celery worker (a process of its own), over the test Postgres and Redis.

The stand-in runs in this process, so a test swaps the token's rules between
two requests (``set_rules``) and reads the audit of every authorization
decision the stand-in made; ``World.settle`` brings the fleet back to rest
(no gang in flight, nothing of ours left on the member) between cases.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import redis
import sqlalchemy as sa
import yaml

from service.app.bootstrap import Services, bootstrap
from service.app.errors import InUse
from service.config import Settings
from sim.kubesim.auth import AuditRecord
from sim.kubesim.testing import RunningCluster
from tests.harness import reset_database
from tests.waiting import wait_for
from tests.workers.conftest import ADMIN, celery_worker, worker_settings, workload_status
from tests.workers.members import ISLAND, members, scheduling, settings, setup_central
from tests.workers.stack import pod_template
from workers.celery_app import make_celery
from workers.fence import CENTRE_LEASE, NAMESPACE
from workers.plan import MANAGED_LABEL, WORKLOAD_ANNOTATION
from workers.records import clusters
from workers.tasks import sender

ROOT = Path(__file__).resolve().parents[2]
MEMBER = ROOT / "deploy" / "member"
ACCOUNT = ("quartermaster-system", "quartermaster-workers")
WORKERS = f"system:serviceaccount:{ACCOUNT[0]}:{ACCOUNT[1]}"
GPU = "nvidia.com/gpu"
KUEUE = "kueue.x-k8s.io/v1beta2"
#: Every job kind the workers dispatch, with where it lives.
JOB_KINDS = {
    "Job": ("batch/v1", "jobs"),
    "JobSet": ("jobset.x-k8s.io/v1alpha2", "jobsets"),
    "PyTorchJob": ("kubeflow.org/v1", "pytorchjobs"),
    "MPIJob": ("kubeflow.org/v2beta1", "mpijobs"),
    "RayJob": ("ray.io/v1", "rayjobs"),
    "RayCluster": ("ray.io/v1", "rayclusters"),
}
#: The serving kinds the workers run, one object per placement (docs/serving.md).
SERVING_KINDS = {
    "Deployment": ("apps/v1", "deployments"),
    "StatefulSet": ("apps/v1", "statefulsets"),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1", "leaderworkersets"),
}
#: Every kind of ours that runs pods on the member.
RUN_KINDS = {**JOB_KINDS, **SERVING_KINDS}
QUEUE_KINDS = {
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
}
FINAL = frozenset({"Finished", "Cancelled"})
#: Fencing on (a heartbeat Lease on the member), on a scale tests can wait for.
FENCING = {
    "fence_time": 10.0,
    "fence_margin": 3.0,
    "fence_poll_interval": 0.5,
    "fence_stop_time": 1.0,
    "cluster_lease": 60.0,
}


# -- deploy/member, rendered ------------------------------------------------------------


def rendered(directory: Path = MEMBER) -> list[dict[str, Any]]:
    """``kubectl kustomize deploy/member`` (or ``directory``), as objects."""
    text = subprocess.run(
        ["kubectl", "kustomize", str(directory)], check=True, capture_output=True, text=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _binds_workers(binding: dict[str, Any]) -> bool:
    return any(
        s.get("kind") == "ServiceAccount" and (s.get("namespace"), s.get("name")) == ACCOUNT
        for s in binding.get("subjects") or ()
    )


def workers_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rules of every Role and ClusterRole bound to the workers'
    ServiceAccount, as the stand-in's allow-list takes them (a Role's rules
    hold in its binding's namespace only)."""
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
    rules: list[dict[str, Any]] = []
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not _binds_workers(binding):
            continue
        ref = binding["roleRef"]
        if binding["kind"] == "ClusterRoleBinding":
            rules += roles[("ClusterRole", "", ref["name"])]["rules"]
            continue
        namespace = binding["metadata"]["namespace"]
        scope = namespace if ref["kind"] == "Role" else ""
        role = roles[(ref["kind"], scope, ref["name"])]
        rules += [{**rule, "namespaces": [namespace]} for rule in role["rules"]]
    return rules


# -- what the workers are given to run --------------------------------------------------


def _pod(gpus: int, duration: str, cpu: str = "8") -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": cpu, "memory": "8Gi"}
    if gpus:
        requests[GPU] = gpus
    return pod_template(requests, duration)


def gang(
    kind: str, name: str, duration: str, gpus: int = 8, priority_class: str | None = None
) -> dict[str, Any]:
    """A gang of ``gpus`` GPUs that runs on the member as a ``kind``: a
    Workload of one pod set (Job) or two (JobSet), or a PyTorchJob, MPIJob,
    RayJob or RayCluster manifest (a RayCluster runs until it is cancelled)."""
    labels = {"kueue.x-k8s.io/queue-name": "train"}
    # Whole nodes' worth of GPUs in one pod, the rest CPU only: gangs that
    # fill the member leave no GPUs stranded in halves of nodes.
    if kind == "PyTorchJob":
        specs = {
            "Master": {"replicas": 1, "template": _pod(0, duration, cpu="1")},
            "Worker": {"replicas": 1, "template": _pod(gpus, duration)},
        }
        body = {"pytorchReplicaSpecs": specs}
    elif kind == "MPIJob":
        specs = {
            "Launcher": {"replicas": 1, "template": _pod(0, duration, cpu="1")},
            "Worker": {"replicas": 1, "template": _pod(gpus, duration)},
        }
        body = {"mpiReplicaSpecs": specs}
    elif kind in ("RayJob", "RayCluster"):
        body = _ray_cluster(_pod(0, duration, cpu="1"), _pod(gpus, duration))
        if kind == "RayJob":
            body = {
                "entrypoint": "python main.py",
                "shutdownAfterJobFinishes": True,
                "rayClusterSpec": body,
                "submitterPodTemplate": _pod(0, duration, cpu="1"),
            }
    else:
        sets = [("workers", gpus)] if kind == "Job" else [("a", gpus), ("b", 0)]
        pod_sets = [{"name": n, "count": 1, "template": _pod(g, duration)} for n, g in sets]
        spec: dict[str, Any] = {"queueName": "train", "podSets": pod_sets}
        if priority_class:
            spec["priorityClassName"] = priority_class
        return {
            "apiVersion": "quartermaster.dev/v1",
            "kind": "Workload",
            "metadata": {"name": name},
            "spec": spec,
        }
    api_version = JOB_KINDS[kind][0]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "labels": labels},
        "spec": body,
    }


def _serving_pod(app: str, **annotations: str) -> dict[str, Any]:
    """One GPU, serving until deleted (no simulated end), labelled ``app``."""
    template = pod_template({"cpu": "1", "memory": "1Gi", GPU: 1})
    template["spec"].pop("restartPolicy")  # a serving pod restarts: Always, the default
    template["metadata"] = {"labels": {"app": app}, "annotations": annotations}
    return template


def serving(kind: str, name: str, replicas: int = 1) -> dict[str, Any]:
    """A serving workload of ``replicas`` one-GPU replicas (a LeaderWorkerSet's
    groups of a leader and a worker, in one island) in the inference queue."""
    if kind == "LeaderWorkerSet":
        worker = _serving_pod(name, **{"kueue.x-k8s.io/podset-required-topology": ISLAND})
        spec: dict[str, Any] = {
            "replicas": replicas,
            "leaderWorkerTemplate": {"size": 2, "workerTemplate": worker},
        }
    else:
        spec = {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": _serving_pod(name),
        }
        if kind == "StatefulSet":
            spec["serviceName"] = name
    return {
        "apiVersion": SERVING_KINDS[kind][0],
        "kind": kind,
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "serve"}},
        "spec": spec,
    }


def _ray_cluster(head: dict[str, Any], worker: dict[str, Any]) -> dict[str, Any]:
    return {
        "headGroupSpec": {"rayStartParams": {}, "template": head},
        "workerGroupSpecs": [
            {
                "groupName": "workers",
                "replicas": 1,
                "minReplicas": 1,
                "maxReplicas": 1,
                "template": worker,
            }
        ],
    }


def stray(kind: str, name: str, namespace: str = "team-a") -> dict[str, Any]:
    """A job of ours that no gang wants (left by a crash, say): our managed
    label, no admission."""
    template = {
        "metadata": {"annotations": {"quartermaster.dev/sim-duration": "1h"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
        },
    }
    job = {"parallelism": 1, "completions": 1, "template": template}
    served = {
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": template["spec"]["containers"]},
    }
    replicas = {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": served}
    specs: dict[str, Any] = {
        "Deployment": replicas,
        "StatefulSet": {**replicas, "serviceName": name},
        "LeaderWorkerSet": {
            "replicas": 1,
            "leaderWorkerTemplate": {"size": 1, "workerTemplate": served},
        },
        "Job": job,
        "JobSet": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": job}}]},
        "PyTorchJob": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template}}},
        "MPIJob": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1, "template": template}}},
        "RayCluster": {"headGroupSpec": {"rayStartParams": {}, "template": template}},
        "RayJob": {
            "entrypoint": "python main.py",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": template}},
            "submitterPodTemplate": template,
        },
    }
    return {
        "apiVersion": RUN_KINDS[kind][0],
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_LABEL: "true"}},
        "spec": specs[kind],
    }


# -- the world ---------------------------------------------------------------------------


@dataclass
class World:
    engine: sa.Engine
    services: Services
    member: RunningCluster
    rules: list[dict[str, Any]]
    token: str
    namespaces: int = 0
    names: dict[str, int] = field(default_factory=dict)
    #: The audit's length when every rule was last granted (at the start, or
    #: when a case gave back the grant it took away).
    granted_at: int = 0

    # -- the centre ----------------------------------------------------------------------

    def cluster_body(self) -> dict[str, Any]:
        """The Cluster object that registers the member with the workers' token."""
        assert self.member.ca_file is not None
        return {
            "metadata": {"name": self.member.name},
            "spec": {
                "server": self.member.url,
                "caData": self.member.ca_file.read_text(),
                "credentials": {"token": self.token},
            },
        }

    def cluster(self) -> Any:
        with self.engine.connect() as conn:
            rows = [r for r in clusters(conn) if r.name == self.member.name]
        return rows[0] if rows else None

    def registered(self) -> None:
        """The member registered (again, after a test deleted it) and Ready."""
        row = self.cluster()
        if row is None or row.deleted:
            self.services.resources.create(ADMIN, "clusters", "", self.cluster_body())
        wait_for(self._ready, 60, "the member Ready")

    def _ready(self) -> bool:
        row = self.cluster()
        return bool(
            row is not None
            and not row.deleted
            and row.state == "Ready"
            and (row.status.get("inventory") or {}).get("nodes")
        )

    def delete_cluster(self) -> None:
        """Delete the Cluster once no gang holds it (the API refuses till then)."""

        def deleted() -> bool:
            try:
                self.services.resources.delete(ADMIN, "clusters", "", self.member.name, None)
            except InUse:
                return False
            return True

        wait_for(deleted, 60, "the Cluster deletable")

    def name(self, prefix: str) -> str:
        self.names[prefix] = self.names.get(prefix, 0) + 1
        return f"{prefix}-{self.names[prefix]}"

    def submit(self, body: dict[str, Any], namespace: str = "team-a") -> tuple[str, str]:
        self.services.submissions.submit(ADMIN, namespace, body)
        return namespace, str(body["metadata"]["name"])

    def state(self, key: tuple[str, str]) -> str:
        return str(workload_status(self.engine, *key).get("state"))

    def new_namespace(self) -> str:
        """A team namespace the member has not seen, with a central LocalQueue."""
        self.namespaces += 1
        namespace = f"team-n{self.namespaces}"
        self.services.resources.create(
            ADMIN,
            "localqueues",
            namespace,
            {"metadata": {"name": "train"}, "spec": {"clusterQueue": "cq"}},
        )
        return namespace

    def active(self) -> list[str]:
        """Workloads not yet Finished or Cancelled."""
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT namespace, name, status->>'state' FROM resources "
                "WHERE kind = 'Workload' AND NOT deleted"
            ).all()
        return [f"{ns}/{n} {s}" for ns, n, s in rows if s not in FINAL]

    # -- the member ----------------------------------------------------------------------

    def ours(self) -> list[str]:
        """Every job and queue object on the member that carries our label."""

        def read() -> list[str]:
            found = []
            kinds = [(v, k) for k, (v, _) in RUN_KINDS.items()] + [(KUEUE, k) for k in QUEUE_KINDS]
            for api_version, kind in kinds:
                rtype = self.member.cluster.core.for_kind(api_version, kind).rtype
                for obj in self.member.cluster.store.items(rtype):
                    if (obj["metadata"].get("labels") or {}).get(MANAGED_LABEL):
                        found.append(f"{kind} {obj['metadata']['name']}")
            return sorted(found)

        return self.member.run(read)

    def job_of(self, key: tuple[str, str]) -> str | None:
        """The member job a workload runs as, ``Kind name``."""
        wanted = f"{key[0]}/{key[1]}"

        def read() -> str | None:
            for kind, (api_version, _) in RUN_KINDS.items():
                rtype = self.member.cluster.core.for_kind(api_version, kind).rtype
                for obj in self.member.cluster.store.items(rtype):
                    annotations = obj["metadata"].get("annotations") or {}
                    if annotations.get(WORKLOAD_ANNOTATION) == wanted:
                        return f"{kind} {obj['metadata']['name']}"
            return None

        return self.member.run(read)

    def replicas_here(self, key: tuple[str, str]) -> int | None:
        """``spec.replicas`` of the serving object a workload runs as here."""
        found = self.job_of(key)
        if found is None:
            return None
        kind, _, name = found.partition(" ")
        obj = self.get(kind, name, key[0])
        return None if obj is None else int(obj["spec"].get("replicas", 1))

    def get(self, kind: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        api_version = RUN_KINDS[kind][0] if kind in RUN_KINDS else KUEUE
        if kind == "Lease":
            api_version = "coordination.k8s.io/v1"
        elif kind == "Namespace":
            api_version = "v1"
        return self.member.get(api_version, kind, namespace, name)

    def admin(self) -> Any:
        return self.member.api_client()

    def create(self, obj: dict[str, Any]) -> None:
        """Create ``obj`` on the member as its administrator (and its
        namespace, if the member has none of that name yet)."""
        group, _, version = str(obj["apiVersion"]).rpartition("/")
        plural = RUN_KINDS[str(obj["kind"])][1]
        namespace = obj["metadata"]["namespace"]
        with self.admin() as api:
            if self.get("Namespace", namespace) is None:
                core: Any = kubernetes.client.CoreV1Api(api)
                core.create_namespace({"metadata": {"name": namespace}})
            kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                group, version, obj["metadata"]["namespace"], plural, obj
            )

    def drop_centre_lease(self) -> None:
        with self.admin() as api:
            kubernetes.client.CoordinationV1Api(api).delete_namespaced_lease(
                CENTRE_LEASE, NAMESPACE
            )

    def rewatch(self) -> None:
        """End every open watch, as an API server does at its watch timeout:
        the workers' watches start again, with a new request each."""

        def end() -> None:
            for watcher in list(self.member.cluster.watchers):
                watcher.close()

        self.member.run(end)

    # -- rules and the audit --------------------------------------------------------------

    def grant(self, rules: list[dict[str, Any]] | None = None) -> None:
        """``rules`` alone, or every rule again."""
        self.member.set_rules(WORKERS, self.rules if rules is None else rules)
        if rules is None:
            self.granted_at = self.mark()

    def audit(self, since: int = 0) -> list[AuditRecord]:
        return self.member.audit(WORKERS)[since:]

    def mark(self) -> int:
        return len(self.member.audit(WORKERS))

    def settle(self) -> None:
        """At rest: every gang ended, nothing of ours on the member but
        Namespaces, the heartbeat Lease there again, the member Ready."""
        wait_for(lambda: not self.active(), 120, "every gang ended", seen=self.active)
        wait_for(lambda: not self.ours(), 120, "the member swept", seen=self.ours)
        wait_for(lambda: self.get("Lease", CENTRE_LEASE, NAMESPACE), 60, "the heartbeat Lease")
        wait_for(self._ready, 60, "the member Ready")


def setup(world_services: Services, member: RunningCluster) -> None:
    """The quotas (32 GPUs, preemption by priority within the queue, a
    priority class ``urgent``), the member's quartermaster-system Namespace
    as deploy/member makes it."""
    setup_central(
        world_services,
        [],
        gpu_quota=32,
        preemption={"withinClusterQueue": "LowerPriority"},
    )
    world_services.resources.create(
        ADMIN, "workloadpriorityclasses", "", {"metadata": {"name": "urgent"}, "value": 1000}
    )
    # The inference queue ``serve`` in team-a: the serving kinds' class.
    queue = world_services.resources.get(ADMIN.principal, "clusterqueues", "", "cq")
    world_services.resources.create(
        ADMIN,
        "clusterqueues",
        "",
        {"metadata": {"name": "cq-serve"}, "spec": {**queue["spec"], "workloadClass": "inference"}},
    )
    world_services.resources.create(
        ADMIN,
        "localqueues",
        "team-a",
        {"metadata": {"name": "serve"}, "spec": {"clusterQueue": "cq-serve"}},
    )
    namespace = next(o for o in rendered() if o["kind"] == "Namespace")
    with member.api_client() as api:
        core: Any = kubernetes.client.CoreV1Api(api)
        core.create_namespace(namespace)


@contextmanager
def world(database_url: str, redis_url: str, engine: sa.Engine) -> Iterator[World]:
    """The member, the centre and real workers, for one test module."""
    reset_database(engine)
    redis.Redis.from_url(redis_url).flushdb()
    workdir = Path(tempfile.mkdtemp(prefix="qm-rbac-"))
    services = bootstrap(Settings(database_url=database_url, db_pool_size=4))
    try:
        with ExitStack() as stack:
            (member,) = stack.enter_context(members(workdir))
            rules = workers_rules(rendered())
            token = member.add_user(WORKERS, rules)
            setup(services, member)
            celery = make_celery(worker_settings(database_url, redis_url))
            stack.callback(celery.close)
            stack.enter_context(celery_worker(database_url, redis_url))
            config = settings(database_url, redis_url, **FENCING)
            stack.enter_context(scheduling(engine, config, sender(celery), relay=True))
            built = World(engine, services, member, rules, token)
            built.registered()
            yield built
    finally:
        services.close()
        shutil.rmtree(workdir, ignore_errors=True)
        redis.Redis.from_url(redis_url).flushdb()
