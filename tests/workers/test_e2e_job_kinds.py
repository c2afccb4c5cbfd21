"""Job kinds end to end through the real processes (issues 22 and 23): the
API, Postgres, Redis, a Celery worker, the scheduler and a stand-in member,
each a process (tests/workers/stack/), every job submitted as is over HTTP.

* A RayJob (KubeRay's ``ray-operator/config/samples/ray-job.sample.yaml``,
  ``rayjob-sample``, re-expressed: the same head and ``small-group`` worker
  group, here on GPUs, one node each; a submitter pod template, which the
  centre requires; pods that pass the security floor; a simulated run time
  on the submitter): admitted by the centre, applied by the workers to a
  stand-in Kueue member with its queue label and every pod template pinned
  to the admitted island, run there by the member's Kueue and KubeRay
  stand-ins (head, then worker group, then the submitter), read back by
  sync as running, then finished ``Succeeded``; its quota released, its
  usage in the ledger.
* A TrainJob (Trainer's ``pytorch`` example on its ``torch-distributed``
  ClusterTrainingRuntime, registered over HTTP as Kubeflow Trainer writes
  it): admitted as the JobSet the runtime describes (``trainer-node`` of
  ``numNodes`` pods), run by the stand-in Kueue member's JobSet controller,
  finished ``succeeded``, its usage in the ledger.
* Two of Volcano's examples, on a member of either backend, admitted whole,
  run as the JobSet of their tasks (docs/volcano.md; on a Volcano member
  its pods the centre's PodGroup's, bound by the Volcano scheduler), their
  GPU workers inside one fabric island, ending Completed there and Finished
  (succeeded) at the centre:

  - ``example/integrations/tensorflow/dist-mnist``: a parameter server and
    two workers, ``minAvailable: 3``; every pod ends by itself.
  - ``example/integrations/mpi``: a master whose completion completes the
    job (``TaskCompleted`` → ``CompleteJob``) and two workers that would
    serve it for ever; the JobSet's success policy ends it when the master
    ends, and the workers are stopped.

Every test here asks for the same fleet (one member, two islands of two
8-GPU nodes; a queue of 32 GPUs): one stack per member backend serves them
in turn, on a database and a Redis db of its own, each test's workload of a
name of its own and every check on that workload's rows, pods and entries.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
import redis
import sqlalchemy as sa
from kubernetes import watch

from service.app.bootstrap import make_engine
from service.app.migrate import upgrade
from service.runtime.demo import StandIn
from tests.floor.test_workload_kinds import volcano_mpi, volcano_tf_mnist
from tests.harness import scratch_database
from tests.waiting import LONG_CEILING, wait_for
from tests.workers.stack import (
    FAST,
    GPU,
    ISLAND,
    MemberWatch,
    Stack,
    base_manifests,
    local_queue,
    pod_template,
    team_queue,
    write_fleet,
)
from tests.workers.stack.watch import cut_short

NS = "team-a"
REQUIRED = "kueue.x-k8s.io/podset-required-topology"


@dataclass
class Member:
    """The running stack of one member of ``backend``, and its database."""

    stack: Stack
    engine: sa.Engine
    backend: str


@pytest.fixture(scope="module")
def member(
    request: pytest.FixtureRequest,
    postgres_server_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Member]:
    """One member ``m1`` of ``request.param`` (``kueue`` or ``volcano``),
    two islands of two 8-GPU nodes; ClusterQueue and LocalQueue of 32 GPUs
    for ``team-a``. The Redis db is this process's, emptied before and after."""
    backend = str(request.param)
    broker = redis.Redis.from_url(redis_url)
    broker.flushdb()
    with ExitStack() as stack:
        stack.callback(broker.close)
        stack.callback(broker.flushdb)
        database = stack.enter_context(scratch_database(postgres_server_url, "kinds"))
        upgrade(database)
        engine = make_engine(database, pool_size=4)
        stack.callback(engine.dispose)
        workdir = tmp_path_factory.mktemp(f"kinds-{backend}")
        fleet = write_fleet(workdir / "fleet.yaml", {"m1": (2, 2)}, {"m1": backend})
        running = stack.enter_context(Stack(workdir, database, redis_url, FAST))
        manifests = [*base_manifests(), team_queue(NS, 32), local_queue(NS, NS)]
        running.start(fleet, 1, manifests, time_scale=0.01)
        yield Member(running, engine, backend)


def _status(engine: sa.Engine, name: str, namespace: str = NS) -> dict[str, Any]:
    with engine.connect() as conn:
        found = conn.exec_driver_sql(
            "SELECT status FROM resources WHERE kind = 'Workload' "
            "AND namespace = %(ns)s AND name = %(name)s",
            {"ns": namespace, "name": name},
        ).scalar_one_or_none()
    return dict(found or {})


def _events(engine: sa.Engine, name: str) -> list[str]:
    """Workload ``name``'s event types, in order."""
    with engine.connect() as conn:
        return list(
            conn.exec_driver_sql(
                "SELECT type FROM events WHERE type LIKE 'Workload%%' "
                "AND data->>'name' = %(name)s ORDER BY position",
                {"name": name},
            ).scalars()
        )


def _ledger(engine: sa.Engine, name: str) -> list[tuple[str, dict[str, Any]]]:
    """The ledger entries that name workload ``name``, in order."""
    with engine.connect() as conn:
        return [
            (kind, dict(body))
            for kind, body in conn.exec_driver_sql(
                "SELECT kind, body FROM ledger_entries WHERE body::text LIKE %(like)s ORDER BY seq",
                {"like": f"%{name}%"},
            )
        ]


def _finished(member: Member, name: str, what: str) -> dict[str, Any]:
    """Workload ``name``'s status once Finished (the stack's logs if never)."""
    try:
        done: dict[str, Any] = wait_for(
            lambda: (
                _status(member.engine, name).get("state") == "Finished"
                and _status(member.engine, name)
            ),
            LONG_CEILING,
            what,
            seen=lambda: _status(member.engine, name),
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\n{member.stack.logs()}") from None
    return done


# -- RayJob ---------------------------------------------------------------------------------


def _ray_pod(name: str, gpus: int, duration: str | None = None) -> dict[str, Any]:
    template = pod_template({"cpu": "2", "memory": "16Gi", GPU: gpus}, duration)
    template["spec"]["containers"][0]["name"] = name
    del template["spec"]["restartPolicy"]
    return template


def rayjob_sample() -> dict[str, Any]:
    head = _ray_pod("ray-head", 8)
    worker = _ray_pod("ray-worker", 8)
    submitter = _ray_pod("ray-job-submitter", 0, "400s")
    submitter["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "500m", "memory": "200Mi"}
    submitter["spec"]["restartPolicy"] = "Never"
    for template in (head, worker):
        template["metadata"] = {"annotations": {REQUIRED: ISLAND}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "rayjob-sample", "labels": {"kueue.x-k8s.io/queue-name": "train"}},
        "spec": {
            "entrypoint": "python /home/ray/samples/sample_code.py",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 10,
            "runtimeEnvYAML": "pip:\n  - requests==2.26.0\n  - pendulum==2.1.2\n",
            "submitterPodTemplate": submitter,
            "rayClusterSpec": {
                "rayVersion": "2.46.0",
                "headGroupSpec": {"rayStartParams": {}, "template": head},
                "workerGroupSpecs": [
                    {
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 5,
                        "groupName": "small-group",
                        "rayStartParams": {},
                        "template": worker,
                    }
                ],
            },
        },
    }


@pytest.mark.parametrize("member", ["kueue"], indirect=True)
def test_a_kuberay_sample_rayjob_runs_through_the_centre_to_succeeded(member: Member) -> None:
    stack, engine = member.stack, member.engine
    (m1,) = stack.members
    seen: dict[str, Any] = {}
    with stack.client() as api:
        response = api.post(f"/v1/namespaces/{NS}/workloads", json=rayjob_sample())
        assert response.status_code == 201, response.text
        spec = response.json()["spec"]
        assert [(p["name"], p["count"]) for p in spec["podSets"]] == [
            ("head", 1),
            ("small-group", 1),
            ("submitter", 1),
        ]

    def running() -> bool:
        status = _status(engine, "rayjob-sample")
        seen["status"] = status
        return status.get("state") == "Running"

    try:
        wait_for(running, LONG_CEILING, "the RayJob running", seen=lambda: seen)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{stack.logs()}") from None
    admission = seen["status"]["admission"]
    with kubernetes.config.new_client_from_config(
        config_file=str(stack.kubeconfig), context=m1.name
    ) as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        rayjob = custom.get_namespaced_custom_object("ray.io", "v1", NS, "rayjobs", "rayjob-sample")
        assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
        pinned = _templates(rayjob)
        for name, template in pinned.items():  # every pod template pinned
            selector = template["spec"]["nodeSelector"]
            assert selector.get("example.com/gpu") == "h100", (name, selector, admission)
            if name != "submitter":  # the GPU pod sets asked for an island
                assert selector.get(ISLAND), (name, selector, admission)
    finished = _finished(member, "rayjob-sample", "the RayJob finished")
    assert finished["outcome"] == "succeeded", finished
    events = _events(engine, "rayjob-sample")
    order = [e for e in events if e in ("WorkloadAdmitted", "WorkloadRunning", "WorkloadFinished")]
    assert order == ["WorkloadAdmitted", "WorkloadRunning", "WorkloadFinished"], events
    # What its pods ran is metered once the member's pods are read (after the end).
    wait_for(
        lambda: "workload.ran" in [kind for kind, _ in _ledger(engine, "rayjob-sample")],
        LONG_CEILING,
        "its pods' runs in the ledger",
        seen=lambda: [kind for kind, _ in _ledger(engine, "rayjob-sample")],
    )
    ledger = _ledger(engine, "rayjob-sample")
    decisions = [(k, b) for k, b in ledger if k in ("workload.admitted", "workload.finished")]
    assert [kind for kind, _ in decisions] == ["workload.admitted", "workload.finished"], ledger
    closed = decisions[1][1]
    assert closed["outcome"] == "succeeded" and closed["gpu_seconds"] > 0, closed


def _templates(rayjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = copy.deepcopy(rayjob["spec"])
    cluster = spec["rayClusterSpec"]
    out = {"head": cluster["headGroupSpec"]["template"], "submitter": spec["submitterPodTemplate"]}
    for group in cluster["workerGroupSpecs"]:
        out[group["groupName"]] = group["template"]
    return out


# -- TrainJob -------------------------------------------------------------------------------


def torch_distributed() -> dict[str, Any]:
    trainer = pod_template({"cpu": "8", "memory": "64Gi"}, "400s")
    trainer["spec"]["containers"][0]["name"] = "trainer"
    trainer["metadata"]["annotations"][REQUIRED] = ISLAND
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-distributed"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": "trainer-node", "template": {"spec": {"template": trainer}}}
                    ]
                }
            },
        },
    }


def pytorch_simple() -> dict[str, Any]:
    per_node = {"requests": {"cpu": "8", "memory": "64Gi", GPU: 8}, "limits": {GPU: 8}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "pytorch-simple", "labels": {"kueue.x-k8s.io/queue-name": "train"}},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "resourcesPerNode": per_node},
        },
    }


@pytest.mark.parametrize("member", ["kueue"], indirect=True)
def test_a_trainjob_runs_as_its_runtimes_jobset_to_succeeded(member: Member) -> None:
    with member.stack.client() as api:
        registered = api.post("/v1/clustertrainingruntimes", json=torch_distributed())
        assert registered.status_code == 201, registered.text
        response = api.post(f"/v1/namespaces/{NS}/workloads", json=pytorch_simple())
        assert response.status_code == 201, response.text
        spec = response.json()["spec"]
        assert [(p["name"], p["count"]) for p in spec["podSets"]] == [("trainer-node", 2)]
        assert spec["job"]["kind"] == "JobSet"
    finished = _finished(member, "pytorch-simple", "the TrainJob finished")
    assert finished["outcome"] == "succeeded", finished
    assert finished["admission"]["cluster"] == "m1"
    ledger = _ledger(member.engine, "pytorch-simple")
    decisions = [(k, b) for k, b in ledger if k in ("workload.admitted", "workload.finished")]
    assert [k for k, _ in decisions] == ["workload.admitted", "workload.finished"], ledger
    assert decisions[1][1]["gpu_seconds"] > 0


# -- Volcano Jobs ---------------------------------------------------------------------------


def _task(gpus: int, ends: bool = True) -> dict[str, Any]:
    """A task's pod as the floor wants it, 30 s of simulated time (or, one
    that does not end by itself, a million); the GPU workers ask for one
    island, as Kueue's annotation says it."""
    requests = {"cpu": str(gpus or 2), "memory": f"{8 * (gpus or 2)}Gi", GPU: gpus}
    template = pod_template(requests, "30s" if ends else "1000000s")
    if gpus:
        template["metadata"]["annotations"][REQUIRED] = ISLAND
    return template


class JobSetWatch:
    """Every state of the member's JobSets seen through the official
    client's watch, so that one deleted once finished is still known."""

    def __init__(self, member: StandIn, kubeconfig: Path) -> None:
        new_client: Any = kubernetes.config.new_client_from_config
        self.api = new_client(config_file=str(kubeconfig), context=member.name)
        self.seen: dict[str, list[dict[str, Any]]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.watcher: Any = None

    def _follow(self) -> None:
        objects = kubernetes.client.CustomObjectsApi(self.api)
        args = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
        while not self.stop.is_set():
            watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
            self.watcher = watcher
            try:
                for event in watcher.stream(
                    objects.list_cluster_custom_object, *args, timeout_seconds=5
                ):
                    obj = event["object"]
                    self.seen.setdefault(obj["metadata"]["name"], []).append(
                        json.loads(json.dumps(obj))
                    )
                    if self.stop.is_set():
                        break
            except kubernetes.client.exceptions.ApiException:
                self.stop.wait(0.5)
            except Exception:  # the stream cut short on closing
                if not self.stop.is_set():
                    raise

    def completed(self, name: str) -> dict[str, Any] | None:
        for obj in self.seen.get(name, ()):
            conditions = (obj.get("status") or {}).get("conditions") or ()
            if any(c["type"] == "Completed" and c["status"] == "True" for c in conditions):
                return obj
        return None

    def __enter__(self) -> JobSetWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.watcher is not None:
            cut_short(self.watcher)
        self.thread.join(10)
        self.api.close()


def _cluster(stack: Stack, name: str) -> dict[str, Any]:
    with stack.client() as api:
        response = api.get(f"/v1/clusters/{name}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def _workload(api: httpx.Client, name: str) -> dict[str, Any]:
    response = api.get(f"/v1/namespaces/{NS}/workloads/{name}")
    assert response.status_code == 200, response.text
    return dict(response.json())


@dataclass(frozen=True)
class Example:
    manifest: Callable[[Callable[..., dict[str, Any]]], dict[str, Any]]
    tasks: list[tuple[str, int]]
    """(task, pods) in order: the pod sets and the JobSet's replicated jobs."""
    ends_job: str
    """The task whose completion completes the job: the success target."""
    workers_end: bool
    """Whether the GPU workers end by themselves (else they are stopped)."""


EXAMPLES = {
    "tensorflow dist-mnist": Example(volcano_tf_mnist, [("ps", 1), ("worker", 2)], "worker", True),
    "mpi": Example(volcano_mpi, [("mpimaster", 1), ("mpiworker", 2)], "mpimaster", False),
}


@pytest.mark.parametrize("member", ["kueue", "volcano"], indirect=True)
@pytest.mark.parametrize("example", EXAMPLES.values(), ids=list(EXAMPLES))
def test_a_volcano_example_runs_to_completed_on_a_member_of_either_backend(
    member: Member, example: Example
) -> None:
    stack, backend = member.stack, member.backend
    vcjob = example.manifest(_task)
    vcjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "train"
    name = vcjob["metadata"]["name"]
    (m1,) = stack.members
    with (
        MemberWatch(stack.members, stack.kubeconfig) as members,
        JobSetWatch(m1, stack.kubeconfig) as jobsets,
        stack.client() as api,
    ):
        created = api.post(f"/v1/namespaces/{NS}/workloads", json=vcjob)
        assert created.status_code == 201, created.text
        pod_sets = [(p["name"], p["count"]) for p in created.json()["spec"]["podSets"]]
        assert pod_sets == example.tasks
        try:
            wait_for(
                lambda: _workload(api, name)["status"].get("state") == "Finished",
                LONG_CEILING,
                "the Volcano Job finished",
                seen=lambda: _workload(api, name)["status"],
            )
            wait_for(lambda: jobsets.completed(name) is not None, LONG_CEILING, "Completed")
            # Its pods are all gone from the member, stopped or ended.
            wait_for(
                lambda: all(p.deleted for p in members.pods_of(f"{NS}.{name}")),
                LONG_CEILING,
                "pods gone",
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{stack.logs()}") from None
        status = _workload(api, name)["status"]
        ledger = api.get("/v1/ledger/entries", params={"kind": "workload.finished"}).json()
    assert status["admission"]["cluster"] == "m1"
    assert _cluster(stack, "m1")["status"]["backend"] == backend
    if backend == "kueue":
        (done,) = [c for c in status["conditions"] if c["type"] == "Finished"]
        assert done["message"] == "JobSet succeeded on cluster m1", done
    outcomes = [e["body"]["outcome"] for e in ledger["items"] if e["body"]["workload"] == name]
    assert outcomes == ["succeeded"], ledger
    ran = jobsets.completed(name)
    assert ran is not None
    assert [r["name"] for r in ran["spec"]["replicatedJobs"]] == [t for t, _ in example.tasks]
    assert ran["spec"]["successPolicy"]["targetReplicatedJobs"] == [example.ends_job]
    schedulers = {
        r["template"]["spec"]["template"]["spec"].get("schedulerName", "default-scheduler")
        for r in ran["spec"]["replicatedJobs"]
    }
    # On a Volcano member its pods are the centre's PodGroup's, bound by volcano.
    assert schedulers == {"volcano" if backend == "volcano" else "default-scheduler"}
    # Every pod of every task ran; the workers in one island, stopped or ended.
    pods = members.pods_of(f"{NS}.{name}")
    assert sorted(p.gpus for p in pods) == [0, 8, 8]
    assert all("Running" in p.phases for p in pods), [(p.name, p.phases) for p in pods]
    (head,) = [p for p in pods if not p.gpus]
    assert "Succeeded" in head.phases
    workers = [p for p in pods if p.gpus]
    assert all(("Succeeded" in p.phases) == example.workers_end for p in workers), [
        (p.name, p.phases) for p in workers
    ]
    islands = {members.node_island[("m1", str(p.node))] for p in workers}
    assignment = {a["name"]: a for a in status["admission"]["podSetAssignments"]}
    assert len(islands) == 1
    assert islands == set(assignment[example.tasks[1][0]]["islands"])
    assert not members.overcommits and not members.errors
