"""Serving workloads on stand-in members, over HTTPS through the official
client (issue 22, the member side): from the centre's per-replica
admissions (``status.replicaAdmissions``, written here as the centre
writes them), reconcile makes one member object per placement with the
admitted count, scales it in place, deletes it when no replica is left
there; sync reads its available replicas back and turns the workload
Running. Real Postgres; the passes run in this process, one at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import kubernetes
import sqlalchemy as sa

from service.app.admission import workloads_by_key
from service.app.bootstrap import Services
from service.app.uow import SqlUnitOfWork
from sim.kubesim.testing import RunningCluster
from tests.floor.test_workload_kinds import deployment, pod, vllm_lws
from tests.waiting import LONG_CEILING, wait_for
from tests.workers.conftest import ADMIN, GPU, workload_status
from tests.workers.members import ISLAND, ledger, members, settings, setup_central
from tests.workers.stack import FAST, Stack, base_manifests, local_queue, team_queue, write_fleet
from workers.clusters import MemberError
from workers.fleet import Connector, reconcile_once, sync_once
from workers.records import append_workload
from workers.settings import WorkerSettings

NS = "serve"
QUEUE = "kueue.x-k8s.io/queue-name"
Obj = dict[str, Any]


def _clock() -> datetime:
    return datetime.now(UTC)


def _setup(services: Services, cluster: RunningCluster) -> None:
    """The fleet of members.py, and an inference ClusterQueue ``serve``
    with its LocalQueue in ``serve``."""
    setup_central(services, [cluster])
    resources = [
        {"name": "cpu", "nominalQuota": 1024},
        {"name": "memory", "nominalQuota": "8Ti"},
        {"name": GPU, "nominalQuota": 32},
    ]
    services.resources.create(
        ADMIN,
        "clusterqueues",
        "",
        {
            "metadata": {"name": "serve"},
            "spec": {
                "namespaceSelector": {},
                "workloadClass": "inference",
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", GPU],
                        "flavors": [{"name": "h100", "resources": resources}],
                    }
                ],
            },
        },
    )
    services.resources.create(
        ADMIN, "localqueues", NS, {"metadata": {"name": "serve"}, "spec": {"clusterQueue": "serve"}}
    )


def _submit(services: Services, manifest: Obj) -> tuple[str, list[Mapping[str, Any]]]:
    """Submit a serving manifest: its name and one replica's pod sets."""
    manifest["metadata"]["labels"][QUEUE] = "serve"
    created = services.submissions.submit(ADMIN, NS, manifest)
    return str(manifest["metadata"]["name"]), list(created["spec"]["podSets"])


def _unit(index: int, island: str, pod_sets: Sequence[Mapping[str, Any]]) -> Obj:
    """One replica's admission, shaped as ``status.admission``."""
    return {
        "replica": index,
        "admittedAt": f"2026-01-01T00:00:{index:02d}Z",
        "admission": {
            "id": str(uuid4()),
            "clusterQueue": "serve",
            "cluster": "c1",
            "island": island,
            "podSetAssignments": [
                {
                    "name": ps["name"],
                    "count": ps["count"],
                    "flavors": {r: "h100" for r in ("cpu", "memory", GPU)},
                    "resourceUsage": _usage(int(ps["count"])),
                    "islands": [island],
                }
                for ps in pod_sets
            ],
        },
    }


def _usage(pods: int) -> dict[str, str]:
    """What ``pods`` of :func:`_served`'s template reserve: 4 cpus, 16 GiB, a GPU each."""
    return {"cpu": str(4 * pods), "memory": f"{16 * pods}Gi", GPU: str(pods)}


def _admit(engine: sa.Engine, name: str, units: list[Obj]) -> None:
    """What the centre writes when the admission cycle admits (or releases)
    replicas: ``replicaAdmissions`` and ``admittedReplicas`` on the row."""
    with engine.connect() as conn:
        (row,) = workloads_by_key(conn, [(NS, name)])
    status = {**row.status, "replicaAdmissions": units, "admittedReplicas": len(units)}
    if status.get("state") == "Pending" and units:
        status["state"] = "Admitted"
    with SqlUnitOfWork(engine) as uow:
        append_workload(uow, row, "WorkloadAdmitted", status, "test:centre", _clock())
        uow.commit()


@contextmanager
def _member(
    tmp_path: Path,
    services: Services,
    database_url: str,
    broker: str,
    lease: float = 60.0,
    **kw: Any,
) -> Iterator[tuple[RunningCluster, Callable[[], None]]]:
    """A stand-in member ``c1`` registered centrally, and one pass over it
    (sync, reconcile, sync), as the fleet loop runs them."""
    with members(tmp_path, **kw) as (c1,):
        _setup(services, c1)
        config: WorkerSettings = settings(database_url, broker, cluster_lease=lease)
        connect = Connector(config)
        engine = services.engine

        def one_pass() -> None:
            sync_once(engine, "c1", connect, config, _clock)
            try:
                reconcile_once(engine, "c1", connect, config, _clock)
            except MemberError:
                return  # unreachable: the fleet loop tries again, as here
            sync_once(engine, "c1", connect, config, _clock)

        yield c1, one_pass


def _islands(c1: RunningCluster) -> list[str]:
    with c1.api_client() as client:
        nodes = kubernetes.client.CoreV1Api(client).list_node().items
    return sorted({str(n.metadata.labels[ISLAND]) for n in nodes})


def _deployments(c1: RunningCluster) -> list[Any]:
    with c1.api_client() as client:
        return list(kubernetes.client.AppsV1Api(client).list_namespaced_deployment(NS).items)


def _stored(c1: RunningCluster) -> list[Obj]:
    """The Deployments in the stand-in's store (no HTTP: it may be partitioned)."""

    def read() -> list[Obj]:
        resource = c1.cluster.core.for_kind("apps/v1", "Deployment")
        return [dict(o) for o in c1.cluster.store.items(resource.rtype)]

    return c1.run(read)


def _lws(c1: RunningCluster) -> list[Obj]:
    with c1.api_client() as client:
        found = kubernetes.client.CustomObjectsApi(client).list_namespaced_custom_object(
            "leaderworkerset.x-k8s.io", "v1", NS, "leaderworkersets"
        )
    return list(found["items"])


def _pods(c1: RunningCluster) -> list[Any]:
    with c1.api_client() as client:
        return list(kubernetes.client.CoreV1Api(client).list_namespaced_pod(NS).items)


def _available(deployment: Any) -> bool:
    conditions = deployment.status.conditions or ()
    return any(c.type == "Available" and c.status == "True" for c in conditions)


def _deployment_admitted(
    services: Services, c1: RunningCluster, replicas: int
) -> tuple[str, str, list[Mapping[str, Any]]]:
    """A Deployment submitted, its first ``replicas`` replicas admitted to c1's
    first island as the centre records them: its name, that island, its pod sets."""
    name, pod_sets = _submit(services, _served(deployment()))
    island = _islands(c1)[0]
    _admit(services.engine, name, [_unit(i, island, pod_sets) for i in range(replicas)])
    return name, island, list(pod_sets)


def _until(one_pass: Callable[[], None], check: Callable[[], Any], what: str, seen: Any) -> Any:
    def step() -> Any:
        one_pass()
        return check()

    return wait_for(step, LONG_CEILING, what, seen=seen)


def _served(manifest: Obj, gpus: int = 1) -> Obj:
    """``manifest`` with one-GPU pods that serve until deleted (no simulated end)."""
    for template in _templates(manifest):
        annotations = (template.get("metadata") or {}).get("annotations") or {}
        template.clear()
        template.update(pod(gpus=gpus, cpu="4", memory="16Gi", **annotations))
    return manifest


def _templates(manifest: Obj) -> list[Obj]:
    spec = manifest["spec"]
    if manifest["kind"] == "LeaderWorkerSet":
        group = spec["leaderWorkerTemplate"]
        return [group[k] for k in ("leaderTemplate", "workerTemplate") if k in group]
    return [spec["template"]]


def test_a_deployment_is_planned_from_its_replicas_reaches_available_and_scales_in_place(
    services: Services, database_url: str, broker: str, tmp_path: Path
) -> None:
    engine = services.engine
    with _member(tmp_path, services, database_url, broker) as (c1, one_pass):
        one_pass()  # the heartbeat: c1 Ready, its islands known
        name, island, pod_sets = _deployment_admitted(services, c1, 3)

        def available(count: int) -> Any:
            found = _deployments(c1)
            ready = len(found) == 1 and found[0].spec.replicas == count and _available(found[0])
            return ready and (found[0].status.available_replicas or 0) == count and found[0]

        three = _until(one_pass, lambda: available(3), "3 replicas available", _deployments)
        assert three.metadata.labels[QUEUE].startswith("qm-")
        assert three.spec.template.spec.restart_policy == "Always"
        assert three.spec.template.spec.node_selector[ISLAND] == island
        status = _until(
            one_pass,
            lambda: (s := workload_status(engine, NS, name))["state"] == "Running" and s,
            "the workload Running",
            lambda: workload_status(engine, NS, name),
        )
        assert status["availableReplicas"] == 3 and status["availableByCluster"] == {"c1": 3}

        five = [_unit(i, island, pod_sets) for i in range(5)]
        _admit(engine, name, five)
        scaled = _until(one_pass, lambda: available(5), "5 replicas available", _deployments)
        assert scaled.metadata.uid == three.metadata.uid, "scaled by a new object, not in place"
        _until(
            one_pass,
            lambda: workload_status(engine, NS, name)["availableReplicas"] == 5,
            "5 replicas recorded available",
            lambda: workload_status(engine, NS, name),
        )

        _admit(engine, name, five[:3])
        down = _until(one_pass, lambda: available(3), "scaled down to 3", _deployments)
        assert down.metadata.uid == three.metadata.uid
        live = _until(
            one_pass,
            lambda: (
                len(pods := [p for p in _pods(c1) if not p.metadata.deletion_timestamp]) == 3
                and pods
            ),
            "3 pods left",
            lambda: [p.metadata.name for p in _pods(c1)],
        )
        assert all(p.spec.node_selector[ISLAND] == island for p in live)
        final = workload_status(engine, NS, name)
        assert final["state"] == "Running" and final["availableReplicas"] == 3, final


def test_replicas_admitted_to_two_islands_make_two_deployments(
    services: Services, database_url: str, broker: str, tmp_path: Path
) -> None:
    engine = services.engine
    with _member(tmp_path, services, database_url, broker) as (c1, one_pass):
        one_pass()
        name, pod_sets = _submit(services, _served(deployment()))
        first, second = _islands(c1)[:2]
        units = [_unit(0, first, pod_sets), _unit(1, second, pod_sets), _unit(2, first, pod_sets)]
        _admit(engine, name, units)

        def both() -> Any:
            found = _deployments(c1)
            return len(found) == 2 and all(_available(d) for d in found) and found

        found = _until(one_pass, both, "two Deployments available", _deployments)
        by_island = {d.spec.template.spec.node_selector[ISLAND]: d.spec.replicas for d in found}
        assert by_island == {first: 2, second: 1}
        assert len({d.metadata.name for d in found}) == 2
        _until(
            one_pass,
            lambda: workload_status(engine, NS, name)["state"] == "Running",
            "the workload Running",
            lambda: workload_status(engine, NS, name),
        )

        # The replica in the second island released: its Deployment goes, the other stays.
        _admit(engine, name, [units[0], units[2]])
        left = _until(
            one_pass,
            lambda: len(d := _deployments(c1)) == 1 and d[0],
            "the second island's Deployment deleted",
            _deployments,
        )
        assert left.spec.template.spec.node_selector[ISLAND] == first
        assert left.metadata.uid in {d.metadata.uid for d in found}


def test_a_leaderworkerset_is_planned_from_its_groups_and_its_ready_groups_run_it(
    services: Services, database_url: str, broker: str, tmp_path: Path
) -> None:
    engine = services.engine
    with _member(tmp_path, services, database_url, broker) as (c1, one_pass):
        one_pass()
        name, pod_sets = _submit(services, _served(vllm_lws()))
        assert sorted(p["name"] for p in pod_sets) == ["leader", "worker"]
        island = _islands(c1)[1]
        _admit(engine, name, [_unit(i, island, pod_sets) for i in range(2)])

        def ready() -> Any:
            found = _lws(c1)
            if len(found) != 1:
                return False
            status = found[0].get("status") or {}
            conditions = {c["type"]: c["status"] for c in status.get("conditions") or ()}
            return status.get("readyReplicas") == 2 and conditions.get("Available") == "True"

        _until(one_pass, ready, "the LeaderWorkerSet Available", _lws)
        (lws,) = _lws(c1)
        assert lws["spec"]["replicas"] == 2
        group = lws["spec"]["leaderWorkerTemplate"]
        for template in (group["leaderTemplate"], group["workerTemplate"]):
            assert template["spec"]["nodeSelector"][ISLAND] == island
        pods = _pods(c1)
        assert len(pods) == 4 and all(p.spec.node_selector[ISLAND] == island for p in pods)
        status = _until(
            one_pass,
            lambda: (s := workload_status(engine, NS, name))["state"] == "Running" and s,
            "the workload Running",
            lambda: workload_status(engine, NS, name),
        )
        assert status["availableReplicas"] == 2


def test_a_deployment_deleted_under_us_is_made_again_with_the_admitted_count(
    services: Services, database_url: str, broker: str, tmp_path: Path
) -> None:
    engine = services.engine
    with _member(tmp_path, services, database_url, broker) as (c1, one_pass):
        one_pass()
        name, _, _ = _deployment_admitted(services, c1, 2)
        first = _until(
            one_pass,
            lambda: len(d := _deployments(c1)) == 1 and _available(d[0]) and d[0],
            "the Deployment available",
            _deployments,
        )
        with c1.api_client() as client:
            kubernetes.client.AppsV1Api(client).delete_namespaced_deployment(
                first.metadata.name, NS, propagation_policy="Foreground"
            )
        _until(
            one_pass,
            lambda: not (d := _deployments(c1)) or d[0].metadata.uid != first.metadata.uid,
            "the Deployment gone",
            _deployments,
        )
        again = _until(
            one_pass,
            lambda: len(d := _deployments(c1)) == 1 and _available(d[0]) and d[0],
            "the Deployment made again",
            _deployments,
        )
        assert again.metadata.uid != first.metadata.uid and again.spec.replicas == 2
        assert workload_status(engine, NS, name)["state"] == "Running"


def test_a_deployment_on_a_volcano_member_runs_under_its_podgroup(
    services: Services, database_url: str, broker: str, tmp_path: Path
) -> None:
    engine = services.engine
    with _member(tmp_path, services, database_url, broker, backend="volcano") as (c1, one_pass):
        one_pass()
        name, island, pod_sets = _deployment_admitted(services, c1, 3)
        found = _one_available(c1, one_pass, 3)
        assert found.spec.template.spec.scheduler_name == "volcano"
        assert QUEUE not in (found.metadata.labels or {})
        (group,) = _podgroups(c1)
        assert group["metadata"]["name"] == found.metadata.name
        assert group["spec"]["minMember"] == 1 and group["spec"]["minResources"][GPU] == "3"
        _until(
            one_pass,
            lambda: workload_status(engine, NS, name)["state"] == "Running",
            "the workload Running",
            lambda: workload_status(engine, NS, name),
        )
        _admit(engine, name, [_unit(i, island, pod_sets) for i in range(4)])
        four = _one_available(c1, one_pass, 4)
        assert four.metadata.uid == found.metadata.uid
        (group,) = _podgroups(c1)
        assert group["spec"]["minResources"][GPU] == "4"


def _one_available(c1: RunningCluster, one_pass: Callable[[], None], replicas: int) -> Any:
    """The member's one Deployment, once ``replicas`` of it are available."""
    return _until(
        one_pass,
        lambda: (
            len(d := _deployments(c1)) == 1
            and (d[0].status.available_replicas or 0) == replicas
            and d[0]
        ),
        f"{replicas} replicas available on the member",
        _deployments,
    )


def _podgroups(c1: RunningCluster) -> list[Obj]:
    with c1.api_client() as client:
        found: list[Obj] = kubernetes.client.CustomObjectsApi(client).list_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", NS, "podgroups"
        )["items"]
    return found


def test_a_deployment_the_member_refuses_releases_every_replica_and_deactivates_it(
    services: Services, database_url: str, broker: str, tmp_path: Path
) -> None:
    engine = services.engine
    with _member(tmp_path, services, database_url, broker) as (c1, one_pass):
        one_pass()
        web = _served(deployment())
        web["spec"]["selector"] = {"matchLabels": {"app": "elsewhere"}}  # apps/v1 refuses it
        name, pod_sets = _submit(services, web)
        island = _islands(c1)[0]
        _admit(engine, name, [_unit(i, island, pod_sets) for i in range(2)])
        refused = _until(
            one_pass,
            lambda: (s := workload_status(engine, NS, name))["state"] == "Evicted" and s,
            "the workload Evicted",
            lambda: workload_status(engine, NS, name),
        )
        assert refused["eviction"]["reason"] == "DispatchFailed"
        assert refused["eviction"]["cluster"] == "c1"
        assert "spec.template.metadata.labels" in refused["eviction"]["message"], refused
        assert refused["replicaAdmissions"] == [] and refused["admittedReplicas"] == 0
        evicted = ledger(engine, "workload.evicted")
        assert [(e["reason"], e["requeued"]) for e in evicted] == [("DispatchFailed", False)] * 2
        with engine.connect() as conn:
            (row,) = workloads_by_key(conn, [(NS, name)])
        assert row.spec["active"] is False
        one_pass()
        assert workload_status(engine, NS, name)["state"] == "Evicted"  # deactivated: it stays
        assert _deployments(c1) == []


def test_a_cancelled_deployment_is_removed_and_each_replica_closed(
    services: Services, database_url: str, broker: str, tmp_path: Path
) -> None:
    engine = services.engine
    with _member(tmp_path, services, database_url, broker) as (c1, one_pass):
        one_pass()
        name, _, _ = _deployment_admitted(services, c1, 2)
        _until(
            one_pass,
            lambda: workload_status(engine, NS, name)["state"] == "Running",
            "the workload Running",
            lambda: workload_status(engine, NS, name),
        )
        services.submissions.cancel(ADMIN, NS, name)
        assert workload_status(engine, NS, name)["state"] == "Cancelling"
        _until(
            one_pass,
            lambda: workload_status(engine, NS, name)["state"] == "Cancelled",
            "the workload Cancelled",
            lambda: (workload_status(engine, NS, name), _deployments(c1)),
        )
        assert _deployments(c1) == []
        closed = [f for f in ledger(engine, "workload.finished") if f["workload"] == name]
        assert [f["outcome"] for f in closed] == ["cancelled", "cancelled"], closed
        assert all(f["cluster"] == "c1" and f["gpu_seconds"] > 0 for f in closed), closed


def test_a_lost_member_releases_its_replicas_and_its_objects_go_when_it_returns(
    services: Services, database_url: str, broker: str, tmp_path: Path
) -> None:
    engine = services.engine
    with _member(tmp_path, services, database_url, broker, lease=2.0) as (c1, one_pass):
        one_pass()
        name, _, _ = _deployment_admitted(services, c1, 2)
        _until(
            one_pass,
            lambda: workload_status(engine, NS, name)["state"] == "Running",
            "the workload Running",
            lambda: workload_status(engine, NS, name),
        )
        c1.partition()
        lost = _until(
            one_pass,
            lambda: (s := workload_status(engine, NS, name))["state"] == "Pending" and s,
            "its replicas released with c1",
            lambda: workload_status(engine, NS, name),
        )
        assert lost["replicaAdmissions"] == [] and lost["admittedReplicas"] == 0
        assert lost["availableReplicas"] == 0 and lost["availableByCluster"] == {}
        evicted = ledger(engine, "workload.evicted")
        assert [(e["workload"], e["reason"]) for e in evicted] == [(name, "ClusterLost")] * 2
        assert all(e["released"]["h100"][GPU] == 1 for e in evicted), evicted
        (cluster_lost,) = ledger(engine, "cluster.lost")
        assert cluster_lost["requeued"] == [f"{NS}/{name}"]
        assert len(_stored(c1)) == 1  # unreachable: still there
        c1.heal()
        _until(one_pass, lambda: not _deployments(c1), "the stale Deployment removed", _deployments)


def test_a_deployment_submitted_over_the_api_runs_and_scales_in_place(
    engine: sa.Engine, database_url: str, broker: str, tmp_path: Path
) -> None:
    """End to end through the real processes once the centre admits
    replicas as units: a Deployment submitted over HTTP, its replicas
    admitted (``replicaAdmissions``), made on the member by the workers,
    read back Running; ``PATCH …/scale`` to 5 reaches the same object."""
    serve = team_queue("serve", 8)
    serve["spec"]["workloadClass"] = "inference"
    manifests = [*base_manifests(), serve, local_queue(NS, "serve", "serve")]
    with Stack(tmp_path, database_url, broker, FAST) as stack:
        stack.start(write_fleet(tmp_path / "fleet.yaml", {"m1": (2, 2)}), 1, manifests)
        (member,) = stack.members
        web = _served(deployment())
        web["metadata"]["labels"][QUEUE] = "serve"
        with stack.client() as api:
            created = api.post(f"/v1/namespaces/{NS}/workloads", json=web)
            assert created.status_code == 201, created.text
            name = str(web["metadata"]["name"])

            def state() -> dict[str, Any]:
                return workload_status(engine, NS, name)

            try:
                wait_for(lambda: state()["state"] == "Running", LONG_CEILING, "Running", seen=state)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{stack.logs()}") from None
            assert state()["admittedReplicas"] == 3 and state()["availableReplicas"] == 3
            (first,) = _deployments_of(stack, member)
            assert first.spec.replicas == 3
            scaled = api.patch(
                f"/v1/namespaces/{NS}/workloads/{name}/scale",
                json={"spec": {"replicas": 5}},
                headers={"Content-Type": "application/json"},
            )
            assert scaled.status_code == 200, scaled.text
            wait_for(
                lambda: state().get("availableReplicas") == 5,
                LONG_CEILING,
                "5 replicas available",
                seen=state,
            )
            (after,) = _deployments_of(stack, member)
            assert after.metadata.uid == first.metadata.uid and after.spec.replicas == 5


def _deployments_of(stack: Stack, member: Any) -> list[Any]:
    """A Stack member's Deployments in ``serve``, through the official client."""
    with kubernetes.config.new_client_from_config(
        config_file=str(stack.kubeconfig), context=member.name
    ) as client:
        return list(kubernetes.client.AppsV1Api(client).list_namespaced_deployment(NS).items)
