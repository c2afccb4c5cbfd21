"""``explain`` tells the true cause of a wait (issue 17, finding 2; issue 18,
finding 11): a gang too big for any island names the largest there is, a
flavor whose labels no node carries says so, quota that can never cover a
gang says what it could give, and a wait behind others gives the position
and counts, naming workloads only in namespaces the reader may read.

The live API over real Postgres; the member clusters' inventories are written
as the workers' sync writes them, and the admission cycle runs in process."""

from __future__ import annotations

import json
from typing import Any

import httpx

from service.app.admission import AdmissionCycle
from service.app.uow import SqlUnitOfWork
from tests.api.conftest import Api, gpu_pod
from tests.workers.conftest import set_cluster_status

GPU = "nvidia.com/gpu"
ISLAND = "example.com/fabric-block"
#: Islands per cluster, in nodes of 8 GPUs: the largest holds 48 GPUs.
FLEET = {"c1": {"c1-a": 6, "c1-b": 4}, "c2": {"c2-a": 2}}


def _created(response: httpx.Response) -> None:
    assert response.status_code == 201, response.text


def _fleet(api: Api, flavor_labels: dict[str, str] | None = None) -> None:
    """Topology, flavor ``h100`` (with the given node labels), and the
    clusters of ``FLEET`` with their nodes (labelled ``sku: h100``)."""
    admin = api.admin
    levels = [{"nodeLabel": ISLAND}, {"nodeLabel": "kubernetes.io/hostname"}]
    _created(
        admin.post(
            "/v1/topologies", json={"metadata": {"name": "fabric"}, "spec": {"levels": levels}}
        )
    )
    labels = flavor_labels or {"sku": "h100"}
    _created(
        admin.post(
            "/v1/resourceflavors",
            json={
                "metadata": {"name": "h100"},
                "spec": {"nodeLabels": labels, "topologyName": "fabric"},
            },
        )
    )
    for cluster, islands in FLEET.items():
        _created(
            admin.post(
                "/v1/clusters",
                json={
                    "metadata": {"name": cluster},
                    "spec": {
                        "server": f"https://{cluster}.example:6443",
                        "credentials": {"token": "t"},
                    },
                },
            )
        )
        nodes = [
            {
                "name": f"{island}-n{n}",
                "flavor": "h100",
                "island": island,
                "labels": {
                    "sku": "h100",
                    ISLAND: island,
                    "kubernetes.io/hostname": f"{island}-n{n}",
                },
                "allocatable": {"cpu": "96", "memory": "1Ti", GPU: 8},
            }
            for island, count in islands.items()
            for n in range(count)
        ]
        set_cluster_status(api.services, cluster, {"state": "Ready", "inventory": {"nodes": nodes}})


def _quota(gpus: int, **limits: Any) -> dict[str, Any]:
    return {
        "coveredResources": ["cpu", "memory", GPU],
        "flavors": [
            {
                "name": "h100",
                "resources": [
                    {"name": "cpu", "nominalQuota": 4096},
                    {"name": "memory", "nominalQuota": "64Ti"},
                    {"name": GPU, "nominalQuota": gpus, **limits},
                ],
            }
        ],
    }


def _queue(
    api: Api,
    name: str = "cq",
    gpus: int = 64,
    namespaces: tuple[str, ...] = ("team-a",),
    **spec: Any,
) -> httpx.Response:
    groups = [_quota(gpus, **spec.pop("limits", {}))]
    response = api.admin.post(
        "/v1/clusterqueues",
        json={
            "metadata": {"name": name},
            "spec": {"namespaceSelector": {}, "resourceGroups": groups, **spec},
        },
    )
    _created(response)
    for ns in namespaces:
        _created(
            api.admin.post(
                f"/v1/namespaces/{ns}/localqueues",
                json={"metadata": {"name": "train"}, "spec": {"clusterQueue": name}},
            )
        )
    return response


def _gang(name: str, count: int, island: bool = True) -> dict[str, Any]:
    pod_set: dict[str, Any] = {"name": "workers", "count": count, "template": gpu_pod(gpus=8)}
    if island:
        pod_set["topologyRequest"] = {"required": ISLAND}
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {"queueName": "train", "podSets": [pod_set]},
    }


def _submit(client: httpx.Client, namespace: str, body: dict[str, Any]) -> None:
    _created(client.post(f"/v1/namespaces/{namespace}/workloads", json=body))


def _no_guard(uow: SqlUnitOfWork) -> None:
    return None


def _cycle(api: Api) -> None:
    AdmissionCycle(api.services.engine, api.services.unit_of_work).run(_no_guard)


def _explain(client: httpx.Client, namespace: str, name: str) -> dict[str, Any]:
    response = client.get(f"/v1/namespaces/{namespace}/workloads/{name}/explain")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _status(client: httpx.Client, namespace: str, name: str) -> dict[str, Any]:
    response = client.get(f"/v1/namespaces/{namespace}/workloads/{name}")
    assert response.status_code == 200, response.text
    status: dict[str, Any] = response.json()["status"]
    return status


def test_a_gang_too_big_for_any_island_is_told_so_with_the_largest(api: Api) -> None:
    """8 x 8 GPUs in one island, where the largest island holds 48: while
    other work holds half the quota, today's answer was "32 more needed"."""
    _fleet(api)
    assert "warning" not in _queue(api, gpus=64).headers  # its flavor's nodes are there
    team = api.as_role("submitter", ["team-a"])
    _submit(team, "team-a", _gang("small", 4))
    _cycle(api)
    assert _status(team, "team-a", "small")["state"] == "Admitted"
    _submit(team, "team-a", _gang("huge", 8))

    before_any_cycle = _explain(team, "team-a", "huge")
    _cycle(api)
    after = _explain(team, "team-a", "huge")
    for answer in (after, before_any_cycle):
        assert answer["state"] == "Pending"
        assert "too big for any island of any cluster" in answer["waitingFor"]
        assert "the largest island is c1/c1-a" in answer["waitingFor"]
        assert f"48 {GPU}" in answer["waitingFor"]
        assert answer["inadmissible"] is True
        assert answer["cause"] == "TooBigForAnyIsland"
        assert answer["largest"] == {
            "flavor": "h100",
            "cluster": "c1",
            "domain": "c1-a",
            "pods": 6,
            "resources": {GPU: "48"},
        }
        assert "more needed" not in json.dumps(answer)
    recorded = _status(team, "team-a", "huge")
    assert recorded["pendingReasonCode"] == "TopologyPlacementFailed"
    assert "too big for any island" in recorded["pendingReason"]
    assert "more needed" not in recorded["pendingReason"]


def test_a_queue_that_refuses_answers_422_with_the_reason(api: Api) -> None:
    _fleet(api)
    _queue(api, gpus=64, unsatisfiable="Refuse")
    team = api.as_role("submitter", ["team-a"])
    refused = team.post("/v1/namespaces/team-a/workloads", json=_gang("huge", 8))
    assert refused.status_code == 422, refused.text
    problem = refused.json()
    assert problem["type"].endswith("/unsatisfiable")
    assert "too big for any island" in problem["detail"]
    assert "the largest island is c1/c1-a" in problem["detail"]
    # What fits the largest island is accepted as ever; nothing of the refused one is stored.
    _submit(team, "team-a", _gang("fits", 6))
    missing = team.get("/v1/namespaces/team-a/workloads/huge")
    assert missing.status_code == 404


def test_a_flavor_whose_labels_no_node_carries_is_told_so(api: Api) -> None:
    """Kueue's docs' flavor: ``sku``, ``pool`` and ``block`` labels; the
    fleet's nodes carry only ``sku``. Today: "no cluster could hold"."""
    _fleet(api, flavor_labels={"sku": "h100", "pool": "train-exclusive", "block": "b1"})
    created = _queue(api, gpus=64)
    team = api.as_role("submitter", ["team-a"])
    _submit(team, "team-a", _gang("two", 2, island=False))
    _cycle(api)
    answer = _explain(team, "team-a", "two")
    carries = "no node of any schedulable cluster carries the labels of flavor h100"
    assert carries in answer["waitingFor"]
    assert "block=b1, pool=train-exclusive, sku=h100" in answer["waitingFor"]
    assert answer["inadmissible"] is True
    assert answer["cause"] == "NoNodeWithFlavorLabels"
    assert "could hold" not in json.dumps(answer)
    assert "carries the labels of flavor h100" in _status(team, "team-a", "two")["pendingReason"]
    assert created.headers.get_list("warning") == [
        "299 - \"ClusterQueue cq: no node of the fleet carries flavor h100's labels "
        '(block=b1, pool=train-exclusive, sku=h100): its quota cannot be used"'
    ]


def test_quota_that_can_never_cover_a_gang_says_what_it_could_give(api: Api) -> None:
    """Nominal 32 GPUs plus 8 borrowable from a cohort: a 64-GPU gang never fits."""
    _fleet(api)
    _queue(api, "lender", gpus=64, namespaces=(), cohortName="research")
    _queue(api, gpus=32, cohortName="research", limits={"borrowingLimit": 8})
    team = api.as_role("submitter", ["team-a"])
    _submit(team, "team-a", _gang("big", 8, island=False))
    _cycle(api)
    answer = _explain(team, "team-a", "big")
    assert f"ClusterQueue cq can use at most 40 {GPU} of flavor h100" in answer["waitingFor"]
    assert "(nominal 32 + 8 borrowable)" in answer["waitingFor"]
    assert answer["inadmissible"] is True
    assert answer["cause"] == "QuotaNeverCovers"


def test_waiting_behind_others_gives_the_position_and_no_other_namespaces_names(
    api: Api,
) -> None:
    """A StrictFIFO queue holds team-a's gang behind vision's head: team-a
    learns its position and how many are ahead, not vision's names."""
    _fleet(api)
    _queue(api, gpus=16, namespaces=("team-a", "vision"), queueingStrategy="StrictFIFO")
    vision = api.as_role("submitter", ["vision"])
    team = api.as_role("submitter", ["team-a"])
    _submit(vision, "vision", _gang("vis-run", 2, island=False))
    _cycle(api)
    _submit(vision, "vision", _gang("vis-probe", 1, island=False))
    _submit(team, "team-a", _gang("mine", 1, island=False))
    _cycle(api)

    answer = _explain(team, "team-a", "mine")
    assert "vision" not in json.dumps(answer)
    assert "vis-probe" not in json.dumps(_status(team, "team-a", "mine"))
    assert answer["inadmissible"] is False
    assert answer["cause"] == "WaitingBehindOthers"
    assert (answer["positionInQueue"], answer["pendingInClusterQueue"]) == (2, 2)
    assert answer["ahead"] == {
        "total": 1,
        "inNamespacesYouCanRead": 0,
        "inOtherNamespaces": 1,
        "workloads": [],
    }
    assert "1 of them in namespaces you cannot read" in answer["waitingFor"]
    assert "(position 2 of 2)" in answer["waitingFor"]

    admin = _explain(api.admin, "team-a", "mine")
    assert admin["ahead"]["workloads"] == ["vision/vis-probe"]
    head = _explain(vision, "vision", "vis-probe")
    assert head["positionInQueue"] == 1 and head["inadmissible"] is False


def test_a_gang_blocked_by_fragmentation_alone_is_told_so_with_the_numbers(api: Api) -> None:
    """Issue 24: 40 GPUs free in the fleet and quota for them, but no island
    holds 5 x 8 GPUs now (c1-a has 8 free, c1-b 32, c2-a none). Before, the
    answer was the same "no cluster has room now" as for a full fleet."""
    _fleet(api)
    _queue(api, gpus=96)
    team = api.as_role("submitter", ["team-a"])
    _submit(team, "team-a", _gang("in-c1-a", 5))
    _submit(team, "team-a", _gang("in-c2-a", 2))
    _cycle(api)
    for name in ("in-c1-a", "in-c2-a"):
        assert _status(team, "team-a", name)["state"] == "Admitted"
    _submit(team, "team-a", _gang("big", 5))
    assert _explain(team, "team-a", "big")["cause"] is None  # not tried yet
    _cycle(api)

    answer = _explain(team, "team-a", "big")
    assert answer["state"] == "Pending"
    assert answer["inadmissible"] is False
    assert answer["cause"] == "FragmentedAcrossIslands"
    assert answer["fragmentation"] == {
        "flavor": "h100",
        "resource": GPU,
        "requested": "40",
        "freeInFleet": "40",
        "largestFreeIsland": {"name": "c1/c1-b", "free": "32"},
    }
    assert f"40 {GPU} of flavor h100 are free in the fleet" in answer["waitingFor"]
    assert "the largest free island (c1/c1-b) has 32" in answer["waitingFor"]
    recorded = _status(team, "team-a", "big")
    assert recorded["pendingReasonCode"] == "WaitingForCapacity"
    assert recorded["pendingCause"] == "FragmentedAcrossIslands"


def test_a_gang_bigger_than_the_free_total_is_not_called_fragmented(api: Api) -> None:
    """The same fleet, but 6 x 8 GPUs wanted with 40 free: it waits for
    capacity, and no fragmentation is claimed (quota covers it)."""
    _fleet(api)
    _queue(api, gpus=104)
    team = api.as_role("submitter", ["team-a"])
    _submit(team, "team-a", _gang("in-c1-a", 5))
    _submit(team, "team-a", _gang("in-c2-a", 2))
    _cycle(api)
    _submit(team, "team-a", _gang("bigger", 6))
    _cycle(api)
    answer = _explain(team, "team-a", "bigger")
    assert answer["state"] == "Pending"
    assert answer["inadmissible"] is False
    assert answer["cause"] == "WaitingForCapacity"
    assert "fragmentation" not in answer
    assert "pendingCause" not in _status(team, "team-a", "bigger")
