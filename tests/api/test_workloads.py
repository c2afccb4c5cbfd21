"""Teams' submissions over HTTP: Workloads and job manifests, the security
floor, references, class isolation, cancel, explain, bulk."""

from __future__ import annotations

import copy
from typing import Any

from tests.api.conftest import Api, gpu_pod, setup_quota, workload
from tests.api.test_resources import _fields, _problem

DIGEST = "registry.example/train@sha256:" + "b" * 64


def test_submit_get_list_and_explain(api: Api) -> None:
    setup_quota(api.admin)
    team = api.as_role("submitter", ["team-a"])
    created = team.post("/v1/namespaces/team-a/workloads", json=workload("w1", count=4))
    assert created.status_code == 201, created.text
    obj = created.json()
    assert obj["metadata"]["namespace"] == "team-a"
    assert obj["status"]["state"] == "Pending"
    assert obj["status"]["clusterQueue"] == "cq-a"
    assert team.post("/v1/namespaces/team-a/workloads", json=workload("w2")).status_code == 201
    listed = team.get("/v1/namespaces/team-a/workloads").json()
    assert [i["metadata"]["name"] for i in listed["items"]] == ["w1", "w2"]
    explained = team.get("/v1/namespaces/team-a/workloads/w2/explain").json()
    assert explained["state"] == "Pending"
    assert explained["positionInQueue"] == 2
    assert explained["pendingInClusterQueue"] == 2
    assert explained["requests"]["nvidia.com/gpu"] == 16
    assert "admission cycle" in explained["waitingFor"]
    by_state = team.get(
        "/v1/namespaces/team-a/workloads",
        params={"fieldSelector": "status.state=Pending,spec.queueName=train"},
    ).json()
    assert len(by_state["items"]) == 2


def test_higher_priority_goes_first_in_the_queue(api: Api) -> None:
    setup_quota(api.admin)
    assert (
        api.admin.post(
            "/v1/workloadpriorityclasses", json={"metadata": {"name": "urgent"}, "value": 100}
        ).status_code
        == 201
    )
    api.admin.post("/v1/namespaces/team-a/workloads", json=workload("early"))
    late = api.admin.post(
        "/v1/namespaces/team-a/workloads", json=workload("late", priorityClassName="urgent")
    )
    assert late.json()["spec"]["priority"] == 100
    assert (
        api.admin.get("/v1/namespaces/team-a/workloads/late/explain").json()["positionInQueue"] == 1
    )
    assert (
        api.admin.get("/v1/namespaces/team-a/workloads/early/explain").json()["positionInQueue"]
        == 2
    )


def _job(name: str, parallelism: int = 4) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "train"}},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": gpu_pod(gpus=2),
        },
    }


def test_job_manifests_become_workloads(api: Api) -> None:
    setup_quota(api.admin)
    job = api.admin.post("/v1/namespaces/team-a/workloads", json=_job("job"))
    assert job.status_code == 201, job.text
    pod_sets = job.json()["spec"]["podSets"]
    assert [(p["name"], p["count"]) for p in pod_sets] == [("main", 4)]
    assert job.json()["spec"]["job"]["kind"] == "Job"

    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js", "labels": {"kueue.x-k8s.io/queue-name": "train"}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "leader",
                    "replicas": 1,
                    "template": {"spec": {"parallelism": 1, "template": gpu_pod(gpus=1)}},
                },
                {
                    "name": "workers",
                    "replicas": 2,
                    "template": {"spec": {"parallelism": 4, "template": gpu_pod(gpus=8)}},
                },
            ]
        },
    }
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=jobset)
    assert created.status_code == 201, created.text
    assert [(p["name"], p["count"]) for p in created.json()["spec"]["podSets"]] == [
        ("leader", 1),
        ("workers", 8),
    ]

    pytorch = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pt", "labels": {"kueue.x-k8s.io/queue-name": "train"}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": gpu_pod()},
                "Worker": {"replicas": 7, "template": gpu_pod()},
            }
        },
    }
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=pytorch)
    assert [(p["name"], p["count"]) for p in created.json()["spec"]["podSets"]] == [
        ("master", 1),
        ("worker", 7),
    ]

    mpi = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "mpi", "labels": {"kueue.x-k8s.io/queue-name": "train"}},
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": gpu_pod(gpus=0)},
                "Worker": {"replicas": 2, "template": gpu_pod()},
            }
        },
    }
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=mpi)
    assert created.status_code == 201, created.text
    assert [p["count"] for p in created.json()["spec"]["podSets"]] == [1, 2]

    unlabeled = _job("nolabel")
    del unlabeled["metadata"]["labels"]
    body = _problem(
        api.admin.post("/v1/namespaces/team-a/workloads", json=unlabeled), 422, "invalid"
    )
    assert _fields(body) == ["metadata.labels.kueue.x-k8s.io/queue-name"]
    body = _problem(
        api.admin.post(
            "/v1/namespaces/team-a/workloads", json={**_job("x"), "apiVersion": "batch/v2"}
        ),
        422,
        "unsupported-kind",
    )
    assert _fields(body) == ["apiVersion"]


def test_security_floor_lists_every_rule_broken_and_records_the_refusal(api: Api) -> None:
    setup_quota(api.admin)
    bad = workload("bad")
    bad["spec"]["podSets"][0]["template"] = {
        "spec": {
            "hostNetwork": True,
            "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:latest",
                    "securityContext": {"privileged": True, "allowPrivilegeEscalation": True},
                    "resources": {"limits": {"nvidia.com/gpu": 8}},
                }
            ],
        }
    }
    body = _problem(
        api.admin.post("/v1/namespaces/team-a/workloads", json=bad), 422, "policy-refused"
    )
    prefix = "spec.podSets[0].template.spec"
    assert set(_fields(body)) == {
        f"{prefix}.serviceAccountName",
        f"{prefix}.hostNetwork",
        f"{prefix}.volumes[0].hostPath",
        f"{prefix}.containers[0].image",
        f"{prefix}.containers[0].securityContext.privileged",
        f"{prefix}.containers[0].securityContext.allowPrivilegeEscalation",
        f"{prefix}.runtimeClassName",
        # The restricted profile's: none of them set in this template.
        f"{prefix}.containers[0].securityContext.runAsNonRoot",
        f"{prefix}.containers[0].securityContext.seccompProfile.type",
        f"{prefix}.containers[0].securityContext.capabilities.drop",
    }
    refusals = api.admin.get("/v1/events", params={"type": "SubmissionRefused"}).json()["items"]
    assert len(refusals) == 1
    assert refusals[0]["data"]["name"] == "bad"
    assert len(refusals[0]["data"]["rules"]) == 10
    assert api.admin.get("/v1/namespaces/team-a/workloads/bad").status_code == 404


def test_security_policy_is_configurable_per_cluster_queue(api: Api) -> None:
    setup_quota(
        api.admin, namespace="lab", cq="relaxed", securityPolicy={"requireImageDigest": False}
    )
    relaxed = workload("tagged")
    relaxed["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["image"] = "train:latest"
    assert api.admin.post("/v1/namespaces/lab/workloads", json=relaxed).status_code == 201


def test_unknown_references_and_class_isolation(api: Api) -> None:
    setup_quota(api.admin)
    body = _problem(
        api.admin.post("/v1/namespaces/team-a/workloads", json=workload("w", queue="nope")),
        422,
        "unknown-reference",
    )
    assert _fields(body) == ["spec.queueName"]
    body = _problem(
        api.admin.post(
            "/v1/namespaces/team-a/workloads", json=workload("w", priorityClassName="gold")
        ),
        422,
        "unknown-reference",
    )
    assert _fields(body) == ["spec.priorityClassName"]
    body = _problem(
        api.admin.post(
            "/v1/namespaces/team-a/workloads", json=workload("w", workloadClass="inference")
        ),
        422,
        "invalid",
    )
    assert "serves training" in body["detail"]
    tpu = workload("w")
    tpu["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"][
        "google.com/tpu"
    ] = 4
    body = _problem(api.admin.post("/v1/namespaces/team-a/workloads", json=tpu), 422, "invalid")
    assert "google.com/tpu" in body["detail"]
    wrong_ns = workload("w")
    wrong_ns["metadata"]["namespace"] = "team-b"
    _problem(api.admin.post("/v1/namespaces/team-a/workloads", json=wrong_ns), 422, "invalid")
    bad_quantity = workload("w")
    bad_quantity["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"][
        "requests"
    ]["cpu"] = "lots"
    body = _problem(
        api.admin.post("/v1/namespaces/team-a/workloads", json=bad_quantity), 422, "invalid"
    )
    assert _fields(body) == ["spec.podSets[0].template.spec.containers[0].resources.requests.cpu"]


def test_cancel_and_delete_guards(api: Api) -> None:
    setup_quota(api.admin)
    api.admin.post("/v1/namespaces/team-a/workloads", json=workload("w"))
    body = _problem(api.admin.delete("/v1/namespaces/team-a/localqueues/train"), 409, "in-use")
    assert "Workload/team-a/w" in body["detail"]
    cancelled = api.admin.delete("/v1/namespaces/team-a/workloads/w")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"]["state"] == "Cancelled"
    assert (
        api.admin.post("/v1/namespaces/team-a/workloads/w/cancel").json()["status"]["state"]
        == "Cancelled"
    )
    assert api.admin.delete("/v1/namespaces/team-a/localqueues/train").status_code == 200
    _problem(api.admin.delete("/v1/namespaces/team-a/workloads/none"), 404, "not-found")


def test_bulk_is_all_or_nothing_per_item(api: Api) -> None:
    setup_quota(api.admin)
    api.admin.post("/v1/namespaces/team-a/workloads", json=workload("exists"))
    items = [workload(f"b{i}") for i in range(50)]
    items[3] = workload("b3", queue="missing")
    items[7] = workload("exists")
    items[9] = copy.deepcopy(items[8])
    items[11] = {"kind": "Workload", "metadata": {"name": "NOPE"}, "spec": {}}
    response = api.admin.post("/v1/namespaces/team-a/bulk/workloads", json={"items": items})
    assert response.status_code == 207, response.text
    body = response.json()
    failed = {r["index"]: r for r in body["results"] if r["status"] != 201}
    assert set(failed) == {3, 7, 8, 9, 11}
    assert failed[3]["error"]["errors"][0]["field"] == "spec.queueName"
    assert failed[7]["status"] == 409
    assert body["created"] == 45
    names = {
        i["metadata"]["name"]
        for i in api.admin.get("/v1/namespaces/team-a/workloads").json()["items"]
    }
    assert names == {"exists"} | {f"b{i}" for i in range(50)} - {"b3", "b7", "b8", "b9", "b11"}
    too_many = {"items": [workload(f"x{i}") for i in range(5001)]}
    _problem(api.admin.post("/v1/namespaces/team-a/bulk/workloads", json=too_many), 422, "invalid")


def test_bulk_of_5000_in_one_request(api: Api) -> None:
    setup_quota(api.admin)
    items = [workload(f"w{i:04d}") for i in range(5000)]
    response = api.admin.post("/v1/namespaces/team-a/bulk/workloads", json={"items": items})
    assert response.status_code == 200, response.text[:500]
    assert response.json()["created"] == 5000
    page = api.admin.get("/v1/namespaces/team-a/workloads", params={"limit": 1000}).json()
    assert len(page["items"]) == 1000 and page["metadata"]["continue"]
    assert (
        api.admin.get("/v1/namespaces/team-a/workloads/w4999/explain").json()["positionInQueue"]
        == 5000
    )


def test_pod_requests_count_init_containers_and_limits(api: Api) -> None:
    setup_quota(api.admin)
    body = workload("w", count=1)
    pod = body["spec"]["podSets"][0]["template"]["spec"]
    context = pod["containers"][0]["securityContext"]
    pod["initContainers"] = [
        {
            "name": "init",
            "image": DIGEST,
            "securityContext": context,
            "resources": {"requests": {"cpu": "32"}},
        },
    ]
    pod["containers"].append(
        {
            "name": "side",
            "image": DIGEST,
            "securityContext": context,
            "resources": {"limits": {"cpu": "500m"}},
        }
    )
    assert api.admin.post("/v1/namespaces/team-a/workloads", json=body).status_code == 201
    explained = api.admin.get("/v1/namespaces/team-a/workloads/w/explain").json()
    assert explained["requests"]["cpu"] == 32000  # max(init 32, 8 + 0.5) in millicores


def test_namespace_and_name_in_the_path_are_validated(api: Api) -> None:
    body = _problem(api.admin.get("/v1/namespaces/Team_A/workloads"), 422, "invalid-request")
    assert _fields(body) == ["namespace"]
    body = _problem(
        api.admin.get("/v1/namespaces/team-a/workloads/Bad_Name"), 422, "invalid-request"
    )
    assert _fields(body) == ["name"]


def test_cancel_honours_if_match(api: Api) -> None:
    setup_quota(api.admin)
    created = api.admin.post("/v1/namespaces/team-a/workloads", json=workload("w")).json()
    version = created["metadata"]["resourceVersion"]
    stale = api.admin.delete("/v1/namespaces/team-a/workloads/w", headers={"If-Match": '"99"'})
    _problem(stale, 409, "stale-version")
    ok = api.admin.delete("/v1/namespaces/team-a/workloads/w", headers={"If-Match": f'"{version}"'})
    assert ok.status_code == 200 and ok.json()["status"]["state"] == "Cancelled"


def test_cancelling_an_admitted_gang_asks_its_cluster_to_reconcile(api: Api) -> None:
    setup_quota(api.admin)
    api.admin.post("/v1/namespaces/team-a/workloads", json=workload("w"))
    with api.services.engine.begin() as conn:  # as the admission cycle would leave it
        conn.exec_driver_sql(
            "UPDATE resources SET status = status || "
            """'{"state": "Admitted", "admission": {"cluster": "east-1"}}'::jsonb """
            "WHERE kind = 'Workload' AND name = 'w'"
        )
    cancelled = api.admin.delete("/v1/namespaces/team-a/workloads/w")
    assert cancelled.json()["status"]["state"] == "Cancelling"
    with api.services.engine.connect() as conn:
        messages = (
            conn.exec_driver_sql("SELECT payload FROM outbox WHERE topic = 'reconcile.cluster'")
            .scalars()
            .all()
        )
    assert messages == [{"cluster": "east-1"}]


def test_the_demo_quotas_apply_and_keep_inference_apart(api: Api) -> None:
    import yaml

    from tests.standalone.test_standalone import REPO

    plurals = {
        "Topology": "topologies",
        "ResourceFlavor": "resourceflavors",
        "Cohort": "cohorts",
        "WorkloadPriorityClass": "workloadpriorityclasses",
        "ClusterQueue": "clusterqueues",
    }
    for doc in yaml.safe_load_all((REPO / "sim/fleets/demo-quotas.yaml").read_text()):
        if doc["kind"] == "LocalQueue":
            path = f"/v1/namespaces/{doc['metadata']['namespace']}/localqueues"
        else:
            path = f"/v1/{plurals[doc['kind']]}"
        assert api.admin.post(path, json=doc).status_code == 201, (doc["kind"], doc["metadata"])
    serve = workload("svc", queue="default", workloadClass="inference")
    pod = serve["spec"]["podSets"][0]["template"]["spec"]
    pod["tolerations"] = []
    assert api.admin.post("/v1/namespaces/serving/workloads", json=serve).status_code == 201
    train = workload("train", queue="default", workloadClass="training")
    body = _problem(api.admin.post("/v1/namespaces/serving/workloads", json=train), 422, "invalid")
    assert "serves inference" in body["detail"]
    assert _fields(body) == ["spec.workloadClass"]
    # A job's class is its kind's (a Job trains) unless its annotation says otherwise.
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "plain", "labels": {"kueue.x-k8s.io/queue-name": "default"}},
        "spec": {"template": copy.deepcopy(serve["spec"]["podSets"][0]["template"])},
    }
    body = _problem(api.admin.post("/v1/namespaces/serving/workloads", json=job), 422, "invalid")
    assert _fields(body) == ["metadata.annotations.quartermaster.dev/workload-class"]
    job["metadata"]["name"] = "annotated"
    job["metadata"]["annotations"] = {"quartermaster.dev/workload-class": "inference"}
    annotated = api.admin.post("/v1/namespaces/serving/workloads", json=job)
    assert annotated.status_code == 201, annotated.text
    assert annotated.json()["spec"]["workloadClass"] == "inference"
