"""Admin resources over HTTP: create, get, list, replace, patch, delete,
optimistic concurrency, validation as Kueue's schema and CEL rules, and
references."""

from __future__ import annotations

import jsonschema_rs
import pytest

from tests.api.conftest import Api, setup_quota

PROBLEM = "application/problem+json"


def _problem(response, status: int, kind: str) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["type"].endswith("/" + kind), body
    return body


def _fields(body: dict) -> list[str]:  # type: ignore[type-arg]
    return [e["field"] for e in body.get("errors", [])]


def test_flavor_lifecycle_with_versions_and_etags(api: Api) -> None:
    admin = api.admin
    created = admin.post(
        "/v1/resourceflavors",
        json={
            "metadata": {"name": "h100", "labels": {"tier": "gold"}},
            "spec": {"nodeLabels": {"sku": "h100"}},
        },
    )
    assert created.status_code == 201, created.text
    flavor = created.json()
    assert flavor["apiVersion"] == "quartermaster.dev/v1"
    assert flavor["kind"] == "ResourceFlavor"
    version = flavor["metadata"]["resourceVersion"]
    assert created.headers["etag"] == f'"{version}"'

    got = admin.get("/v1/resourceflavors/h100").json()
    assert got["spec"] == {"nodeLabels": {"sku": "h100"}, "nodeTaints": [], "tolerations": []}

    got["spec"]["nodeLabels"]["sku"] = "h100-sxm"
    replaced = admin.put("/v1/resourceflavors/h100", json=got)
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["metadata"]["generation"] == 2
    # The version we read is now stale: 409, whether sent in the body or If-Match.
    _problem(admin.put("/v1/resourceflavors/h100", json=got), 409, "stale-version")
    _problem(
        admin.patch(
            "/v1/resourceflavors/h100",
            json={"metadata": {"labels": {"tier": "silver"}}},
            headers={"If-Match": f'"{version}"', "Content-Type": "application/merge-patch+json"},
        ),
        409,
        "stale-version",
    )
    patched = admin.patch(
        "/v1/resourceflavors/h100",
        json={"metadata": {"labels": {"tier": "silver"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["metadata"]["labels"] == {"tier": "silver"}
    assert patched.json()["metadata"]["generation"] == 2  # labels are not spec

    listed = admin.get("/v1/resourceflavors").json()
    assert [i["metadata"]["name"] for i in listed["items"]] == ["h100"]
    assert admin.delete("/v1/resourceflavors/h100").status_code == 200
    _problem(admin.get("/v1/resourceflavors/h100"), 404, "not-found")
    # Re-created after delete: a new uid, versions continue.
    again = admin.post("/v1/resourceflavors", json={"metadata": {"name": "h100"}, "spec": {}})
    assert again.status_code == 201
    assert again.json()["metadata"]["uid"] != flavor["metadata"]["uid"]
    assert int(again.json()["metadata"]["resourceVersion"]) > int(version)


def test_create_twice_conflicts(api: Api) -> None:
    body = {"metadata": {"name": "a100"}, "spec": {}}
    assert api.admin.post("/v1/resourceflavors", json=body).status_code == 201
    _problem(api.admin.post("/v1/resourceflavors", json=body), 409, "already-exists")


def test_yaml_bodies_are_accepted(api: Api) -> None:
    manifest = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: spot
spec:
  nodeLabels:
    instance-type: spot
  nodeTaints:
  - key: spot
    value: "true"
    effect: NoSchedule
"""
    response = api.admin.post(
        "/v1/resourceflavors", content=manifest, headers={"Content-Type": "application/yaml"}
    )
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["nodeTaints"][0]["effect"] == "NoSchedule"


@pytest.mark.parametrize(
    ("body", "content_type", "status", "kind"),
    [
        ("{not json", "application/json", 400, "malformed-body"),
        ("a: [unclosed", "application/yaml", 400, "malformed-body"),
        ("", "application/json", 400, "malformed-body"),
        ("<xml/>", "application/xml", 415, "unsupported-media-type"),
        ("[1, 2]", "application/json", 422, "invalid"),
        (
            '{"metadata": {"name": "x"}, "spec": {"w": NaN}}',
            "application/json",
            400,
            "malformed-body",
        ),
        (
            '{"metadata": {"name": "x"}, "spec": {"w": 1e400}}',
            "application/json",
            400,
            "malformed-body",
        ),
        ("metadata: {name: x}\nspec: {w: .inf}", "application/yaml", 400, "malformed-body"),
    ],
)
def test_malformed_bodies(api: Api, body: str, content_type: str, status: int, kind: str) -> None:
    response = api.admin.post(
        "/v1/resourceflavors", content=body, headers={"Content-Type": content_type}
    )
    _problem(response, status, kind)


def test_oversize_body_is_refused(api: Api) -> None:
    big = {"metadata": {"name": "big", "annotations": {"x": "y" * (2 << 20)}}, "spec": {}}
    _problem(api.admin.post("/v1/resourceflavors", json=big), 413, "body-too-large")


def test_unknown_fields_and_wrong_types_name_the_field(api: Api) -> None:
    body = _problem(
        api.admin.post(
            "/v1/resourceflavors",
            json={"metadata": {"name": "x"}, "spec": {"nodeLabel": {"a": "b"}}, "extra": 1},
        ),
        422,
        "invalid",
    )
    assert set(_fields(body)) >= {"spec.nodeLabel", "extra"}
    body = _problem(
        api.admin.post(
            "/v1/topologies", json={"metadata": {"name": "t"}, "spec": {"levels": "rack"}}
        ),
        422,
        "invalid",
    )
    assert "spec.levels" in _fields(body)
    body = _problem(
        api.admin.post("/v1/resourceflavors", json={"metadata": {"name": "Bad_Name"}, "spec": {}}),
        422,
        "invalid",
    )
    assert "metadata.name" in _fields(body)


def _cq(name: str, **spec: object) -> dict:  # type: ignore[type-arg]
    resources = [{"name": "nvidia.com/gpu", "nominalQuota": 8}]
    groups = [
        {
            "coveredResources": ["nvidia.com/gpu"],
            "flavors": [{"name": "h100", "resources": resources}],
        }
    ]
    return {"metadata": {"name": name}, "spec": {"resourceGroups": groups, **spec}}


def test_cluster_queue_cel_rules(api: Api) -> None:
    admin = api.admin
    assert (
        admin.post(
            "/v1/resourceflavors", json={"metadata": {"name": "h100"}, "spec": {}}
        ).status_code
        == 201
    )
    no_cohort = _cq("a")
    no_cohort["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"] = 4
    body = _problem(admin.post("/v1/clusterqueues", json=no_cohort), 422, "invalid")
    assert "borrowingLimit must be nil when cohort is empty" in body["errors"][0]["message"]
    with_cohort = _cq("a", cohortName="research")
    with_cohort["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"] = 4
    assert admin.post("/v1/clusterqueues", json=with_cohort).status_code == 201

    mismatch = _cq("b")
    mismatch["spec"]["resourceGroups"][0]["coveredResources"] = ["nvidia.com/gpu", "cpu"]
    body = _problem(admin.post("/v1/clusterqueues", json=mismatch), 422, "invalid")
    assert "exactly the group's coveredResources" in body["errors"][0]["message"]

    fungibility = _cq(
        "c",
        flavorFungibility={
            "whenCanBorrow": "MayStopSearch",
            "preference": "BorrowingOverPreemption",
        },
    )
    body = _problem(admin.post("/v1/clusterqueues", json=fungibility), 422, "invalid")
    assert "preference can only be set" in body["errors"][0]["message"]

    preemption = _cq(
        "d",
        preemption={
            "reclaimWithinCohort": "Never",
            "borrowWithinCohort": {"policy": "LowerPriority"},
        },
    )
    _problem(admin.post("/v1/clusterqueues", json=preemption), 422, "invalid")

    unknown_flavor = _cq("e")
    unknown_flavor["spec"]["resourceGroups"][0]["flavors"][0]["name"] = "tpu"
    body = _problem(admin.post("/v1/clusterqueues", json=unknown_flavor), 422, "unknown-reference")
    assert _fields(body) == ["spec.resourceGroups[0].flavors[0].name"]


def test_cohort_cycles_are_refused(api: Api) -> None:
    admin = api.admin
    assert (
        admin.post("/v1/cohorts", json={"metadata": {"name": "root"}, "spec": {}}).status_code
        == 201
    )
    assert (
        admin.post(
            "/v1/cohorts", json={"metadata": {"name": "mid"}, "spec": {"parentName": "root"}}
        ).status_code
        == 201
    )
    assert (
        admin.post(
            "/v1/cohorts", json={"metadata": {"name": "leaf"}, "spec": {"parentName": "mid"}}
        ).status_code
        == 201
    )
    root = admin.get("/v1/cohorts/root").json()
    root["spec"]["parentName"] = "leaf"
    body = _problem(admin.put("/v1/cohorts/root", json=root), 422, "unknown-reference")
    assert "cohort cycle" in body["errors"][0]["message"]
    _problem(
        admin.post(
            "/v1/cohorts", json={"metadata": {"name": "self"}, "spec": {"parentName": "self"}}
        ),
        422,
        "unknown-reference",
    )


def test_topology_rules(api: Api) -> None:
    admin = api.admin
    bad = {
        "metadata": {"name": "t"},
        "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}, {"nodeLabel": "rack"}]},
    }
    _problem(admin.post("/v1/topologies", json=bad), 422, "invalid")
    dup = {
        "metadata": {"name": "t"},
        "spec": {"levels": [{"nodeLabel": "rack"}, {"nodeLabel": "rack"}]},
    }
    _problem(admin.post("/v1/topologies", json=dup), 422, "invalid")
    good = {
        "metadata": {"name": "t"},
        "spec": {
            "levels": [
                {"nodeLabel": "example.com/fabric-block"},
                {"nodeLabel": "kubernetes.io/hostname"},
            ]
        },
    }
    assert admin.post("/v1/topologies", json=good).status_code == 201
    needs_labels = {"metadata": {"name": "f"}, "spec": {"topologyName": "t"}}
    _problem(admin.post("/v1/resourceflavors", json=needs_labels), 422, "invalid")
    missing = {
        "metadata": {"name": "f"},
        "spec": {"topologyName": "nope", "nodeLabels": {"a": "b"}},
    }
    _problem(admin.post("/v1/resourceflavors", json=missing), 422, "unknown-reference")


def test_delete_is_refused_while_something_depends(api: Api) -> None:
    admin = api.admin
    setup_quota(admin)
    body = _problem(admin.delete("/v1/resourceflavors/h100"), 409, "in-use")
    assert "ClusterQueue/cq-a" in body["detail"]
    body = _problem(admin.delete("/v1/clusterqueues/cq-a"), 409, "in-use")
    assert "LocalQueue/team-a/train" in body["detail"]
    assert admin.delete("/v1/namespaces/team-a/localqueues/train").status_code == 200
    assert admin.delete("/v1/clusterqueues/cq-a").status_code == 200
    assert admin.delete("/v1/resourceflavors/h100").status_code == 200


def test_local_queue_needs_its_cluster_queue_and_keeps_it(api: Api) -> None:
    admin = api.admin
    body = _problem(
        admin.post(
            "/v1/namespaces/ns/localqueues",
            json={"metadata": {"name": "q"}, "spec": {"clusterQueue": "none"}},
        ),
        422,
        "unknown-reference",
    )
    assert _fields(body) == ["spec.clusterQueue"]
    setup_quota(admin, namespace="ns")
    admin.post("/v1/clusterqueues", json=_cq("other"))
    lq = admin.get("/v1/namespaces/ns/localqueues/train").json()
    lq["spec"]["clusterQueue"] = "other"
    body = _problem(
        admin.put("/v1/namespaces/ns/localqueues/train", json=lq), 422, "unknown-reference"
    )
    assert body["errors"][0]["message"] == "field is immutable"
    _problem(
        admin.post(
            "/v1/namespaces/ns/localqueues",
            json={
                "metadata": {"name": "q2", "namespace": "other"},
                "spec": {"clusterQueue": "cq-a"},
            },
        ),
        422,
        "invalid",
    )


def test_list_paging_and_selectors(api: Api) -> None:
    admin = api.admin
    for i in range(7):
        labels = {"tier": "gold" if i % 2 else "silver", "index": str(i)}
        assert (
            admin.post(
                "/v1/resourceflavors",
                json={"metadata": {"name": f"f{i}", "labels": labels}, "spec": {}},
            ).status_code
            == 201
        )
    seen, token = [], None
    while True:
        params = {"limit": 3, **({"continue": token} if token else {})}
        page = admin.get("/v1/resourceflavors", params=params).json()
        seen += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
    assert seen == [f"f{i}" for i in range(7)]
    gold = admin.get("/v1/resourceflavors", params={"labelSelector": "tier=gold"}).json()
    assert [i["metadata"]["name"] for i in gold["items"]] == ["f1", "f3", "f5"]
    some = admin.get(
        "/v1/resourceflavors", params={"labelSelector": "index in (0,6),tier!=gold"}
    ).json()
    assert [i["metadata"]["name"] for i in some["items"]] == ["f0", "f6"]
    named = admin.get("/v1/resourceflavors", params={"fieldSelector": "metadata.name=f4"}).json()
    assert [i["metadata"]["name"] for i in named["items"]] == ["f4"]
    _problem(admin.get("/v1/resourceflavors", params={"labelSelector": "a in (("}), 422, "invalid")
    _problem(admin.get("/v1/resourceflavors", params={"fieldSelector": "spec.x=1"}), 422, "invalid")
    _problem(admin.get("/v1/resourceflavors", params={"continue": "garbage!"}), 422, "invalid")


def test_priority_classes_are_flat_like_kueue(api: Api) -> None:
    created = api.admin.post(
        "/v1/workloadpriorityclasses",
        json={
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": "high"},
            "value": 1000,
            "description": "prod",
        },
    )
    assert created.status_code == 201, created.text
    assert created.json()["value"] == 1000
    _problem(
        api.admin.post(
            "/v1/workloadpriorityclasses", json={"metadata": {"name": "x"}, "value": "high"}
        ),
        422,
        "invalid",
    )


def test_kueue_fields_quartermaster_does_not_support_are_refused_by_name(api: Api) -> None:
    assert (
        api.admin.post(
            "/v1/resourceflavors", json={"metadata": {"name": "h100"}, "spec": {}}
        ).status_code
        == 201
    )
    body = _problem(
        api.admin.post(
            "/v1/clusterqueues", json=_cq("a", admissionChecksStrategy={"admissionChecks": []})
        ),
        422,
        "invalid",
    )
    assert (
        "admissionChecksStrategy is a Kueue field Quartermaster does not support"
        in body["errors"][0]["message"]
    )


def test_cluster_queue_preemption_protection_and_budget(api: Api) -> None:
    """Issue 24: ``preemption.protection`` and ``preemption.budget`` are kept as
    given, and a bad value is refused naming its field."""
    admin = api.admin
    assert (
        admin.post(
            "/v1/resourceflavors", json={"metadata": {"name": "h100"}, "spec": {}}
        ).status_code
        == 201
    )
    protected = _cq(
        "protected",
        preemption={
            "reclaimWithinCohort": "Any",
            "protection": {
                "minRuntimeSeconds": 1800,
                "reclaimNominal": "Protected",
                "islandGangGraceSeconds": 14400,
            },
            "budget": {"preemptions": 4, "periodSeconds": 3600},
        },
    )
    assert admin.post("/v1/clusterqueues", json=protected).status_code == 201
    got = admin.get("/v1/clusterqueues/protected").json()["spec"]["preemption"]
    assert got["protection"] == {
        "minRuntimeSeconds": 1800,
        "reclaimNominal": "Protected",
        "islandGangGraceSeconds": 14400,
    }
    assert got["budget"] == {"preemptions": 4, "periodSeconds": 3600}
    for preemption, field in (
        ({"protection": {"minRuntimeSeconds": -1}}, "spec.preemption.protection.minRuntimeSeconds"),
        ({"protection": {"reclaimNominal": "Later"}}, "spec.preemption.protection.reclaimNominal"),
        (
            {"protection": {"islandGangGraceSeconds": -1}},
            "spec.preemption.protection.islandGangGraceSeconds",
        ),
        (
            {"protection": {"islandGangGraceSeconds": "4h"}},
            "spec.preemption.protection.islandGangGraceSeconds",
        ),
        (
            {"budget": {"preemptions": 2, "periodSeconds": 0}},
            "spec.preemption.budget.periodSeconds",
        ),
        ({"budget": {"periodSeconds": 60}}, "spec.preemption.budget.preemptions"),
    ):
        body = _problem(
            admin.post("/v1/clusterqueues", json=_cq("bad", preemption=preemption)), 422, "invalid"
        )
        assert field in _fields(body), (preemption, _fields(body))


def test_label_maps_are_checked_as_kubernetes_does_and_documented_so(api: Api) -> None:
    """Label keys and values are checked whole (a trailing newline is no part
    of a label), selectors' matchLabels too, and /openapi.json says the same
    rules, so that a client generated from it refuses what the server would."""
    admin = api.admin
    bad = {
        "metadata.labels": {"metadata": {"name": "f1", "labels": {"tier\n": "gold"}}, "spec": {}},
        "metadata.labels ": {"metadata": {"name": "f2", "labels": {"tier": "gold\n"}}, "spec": {}},
        "spec.nodeLabels": {"metadata": {"name": "f3"}, "spec": {"nodeLabels": {"a b": "x"}}},
    }
    for field, flavor in bad.items():
        body = _problem(admin.post("/v1/resourceflavors", json=flavor), 422, "invalid")
        assert field.strip() in _fields(body), (flavor, _fields(body))
    good = {"metadata": {"name": "h100", "labels": {"example.com/tier": "gold"}}, "spec": {}}
    assert admin.post("/v1/resourceflavors", json=good).status_code == 201
    selector = _cq("picky", namespaceSelector={"matchLabels": {"team": "not valid!"}})
    body = _problem(admin.post("/v1/clusterqueues", json=selector), 422, "invalid")
    assert "spec.namespaceSelector.matchLabels" in _fields(body), _fields(body)

    document = admin.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    labels = schemas["ObjectMeta"]["properties"]["labels"]
    node_labels = schemas["ResourceFlavorSpec"]["properties"]["nodeLabels"]
    match_labels = schemas["LabelSelector"]["properties"]["matchLabels"]
    untitled = {k: v for k, v in labels.items() if k != "title"}
    assert untitled == {k: v for k, v in match_labels.items() if k != "title"}
    assert node_labels["maxProperties"] == 8
    check = jsonschema_rs.validator_for(labels)
    assert check.is_valid({"example.com/tier": "gold", "team": ""})
    for refused in (
        {"a b": "x"},
        {"team": "not valid!"},
        {"team": "x" * 64},
        {"x" * 317: "a"},
        {"tier\n": "gold"},
        {"tier": "gold\n"},
    ):
        assert not check.is_valid(refused), refused
    assert not jsonschema_rs.validator_for(node_labels).is_valid({f"k{i}": "v" for i in range(9)})
