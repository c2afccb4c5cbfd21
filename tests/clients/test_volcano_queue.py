"""A Volcano ``Queue`` applied centrally (issue 23): the ClusterQueue it maps
to by the rule of docs/volcano.md, as a table of cases (Volcano's own
example queues among them), and each refusal naming its field. Every
mapped ClusterQueue is one the server's schema takes."""

from __future__ import annotations

from typing import Any

import pytest
from quartermaster_client.volcano import QueueRefused, volcano_queue_to_cluster_queue

from service.app.schemas import ClusterQueueSpec

GPU = "nvidia.com/gpu"
FLAVOR = "quartermaster.dev/flavor"
COHORT = "quartermaster.dev/cohort"


def queue(spec: dict[str, Any], **annotations: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "q"}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": metadata,
        "spec": spec,
    }


def _map(body: dict[str, Any], flavors: tuple[str, ...] = ("h100",)) -> dict[str, Any]:
    cluster_queue, _ = volcano_queue_to_cluster_queue(body, lambda: list(flavors))
    ClusterQueueSpec.model_validate(cluster_queue["spec"])  # the server takes it
    return cluster_queue


CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "deserved is the nominal quota, weight the fair-sharing weight": (
        queue({"weight": 4, "deserved": {"cpu": 64, GPU: 8}}, **{FLAVOR: "h100"}),
        {
            "flavor": "h100",
            "cohort": None,
            "weight": 4,
            "resources": [
                {"name": "cpu", "nominalQuota": 64},
                {"name": GPU, "nominalQuota": 8},
            ],
        },
    ),
    "capability is the ceiling: borrowing up to it, in its unit": (
        queue(
            {
                "deserved": {"cpu": "8", "memory": "32Gi", GPU: 8},
                "capability": {"cpu": "16", "memory": "64Gi", GPU: 16},
            },
            **{COHORT: "research"},
        ),
        {
            "flavor": "h100",
            "cohort": "research",
            "weight": 1,
            "resources": [
                {"name": "cpu", "nominalQuota": "8", "borrowingLimit": 8},
                {"name": "memory", "nominalQuota": "32Gi", "borrowingLimit": "32Gi"},
                {"name": GPU, "nominalQuota": 8, "borrowingLimit": 8},
            ],
        },
    ),
    # Volcano's staging/src/volcano.sh/apis/artifacts/queue.yaml
    "capability alone: nothing nominal, all borrowed": (
        queue(
            {"reclaimable": True, "weight": 1, "capability": {"cpu": "2000m", "memory": "4G"}},
            **{COHORT: "research"},
        ),
        {
            "flavor": "h100",
            "cohort": "research",
            "weight": 1,
            "resources": [
                {"name": "cpu", "nominalQuota": 0, "borrowingLimit": "2000m"},
                {"name": "memory", "nominalQuota": 0, "borrowingLimit": "4G"},
            ],
        },
    ),
    # Volcano's example/deployment/queue.yaml, with a deserved share
    "not reclaimable: nothing lent": (
        queue(
            {"weight": 1, "reclaimable": False, "deserved": {"cpu": 1}, "capability": {"cpu": 2}},
            **{COHORT: "research"},
        ),
        {
            "flavor": "h100",
            "cohort": "research",
            "weight": 1,
            "resources": [
                {"name": "cpu", "nominalQuota": 1, "borrowingLimit": 1, "lendingLimit": 0},
            ],
        },
    ),
    "guarantee is never lent": (
        queue(
            {"deserved": {GPU: 16}, "guarantee": {"resource": {GPU: 4}}},
            **{COHORT: "research"},
        ),
        {
            "flavor": "h100",
            "cohort": "research",
            "weight": 1,
            "resources": [{"name": GPU, "nominalQuota": 16, "lendingLimit": 12}],
        },
    ),
}


@pytest.mark.parametrize(("body", "want"), CASES.values(), ids=list(CASES))
def test_a_volcano_queue_maps_to_a_cluster_queue_by_the_rule(
    body: dict[str, Any], want: dict[str, Any]
) -> None:
    mapped = _map(body)
    assert (mapped["apiVersion"], mapped["kind"]) == ("quartermaster.dev/v1", "ClusterQueue")
    assert mapped["metadata"]["name"] == "q"
    spec = mapped["spec"]
    (group,) = spec["resourceGroups"]
    (flavor,) = group["flavors"]
    assert flavor["name"] == want["flavor"]
    assert flavor["resources"] == want["resources"]
    assert group["coveredResources"] == [r["name"] for r in want["resources"]]
    assert spec.get("cohortName") == want["cohort"]
    assert spec["fairSharing"] == {"weight": want["weight"]}
    assert spec["namespaceSelector"] == {}  # a Volcano Queue takes every namespace


def test_the_only_flavor_is_taken_when_none_is_named_and_the_lookup_only_then() -> None:
    asked: list[bool] = []

    def flavors() -> list[str]:
        asked.append(True)
        return ["a100"]

    body = queue({"deserved": {GPU: 8}})
    mapped, _ = volcano_queue_to_cluster_queue(body, flavors)
    assert mapped["spec"]["resourceGroups"][0]["flavors"][0]["name"] == "a100"
    assert asked == [True]
    named, _ = volcano_queue_to_cluster_queue(
        queue({"deserved": {GPU: 8}}, **{FLAVOR: "h100"}), flavors
    )
    assert named["spec"]["resourceGroups"][0]["flavors"][0]["name"] == "h100"
    assert asked == [True]


def test_fields_with_no_cluster_queue_meaning_are_noted() -> None:
    body = queue({"deserved": {GPU: 8}, "priority": 3, "dequeueStrategy": "fifo"})
    _, notes = volcano_queue_to_cluster_queue(body, lambda: ["h100"])
    assert [n.split(":")[1].strip() for n in notes] == [
        "spec.dequeueStrategy is not mapped",
        "spec.priority is not mapped",
    ]


REFUSALS: dict[str, tuple[dict[str, Any], tuple[str, ...], str]] = {
    "no quota at all (weight alone)": (
        queue({"weight": 1}),
        ("h100",),
        "spec.deserved",
    ),
    "deserved above capability (Volcano's webhook)": (
        queue({"deserved": {"cpu": 4}, "capability": {"cpu": 2}}, **{COHORT: "c"}),
        ("h100",),
        "spec.deserved.cpu",
    ),
    "guarantee above deserved (Volcano's webhook)": (
        queue({"deserved": {GPU: 4}, "guarantee": {"resource": {GPU: 8}}}, **{COHORT: "c"}),
        ("h100",),
        f"spec.deserved.{GPU}",
    ),
    "no flavor named among several": (
        queue({"deserved": {GPU: 8}}),
        ("h100", "a100"),
        f"metadata.annotations.{FLAVOR}",
    ),
    "no flavor at all": (queue({"deserved": {GPU: 8}}), (), f"metadata.annotations.{FLAVOR}"),
    "borrowing without a cohort": (
        queue({"deserved": {GPU: 8}, "capability": {GPU: 16}}),
        ("h100",),
        f"metadata.annotations.{COHORT}",
    ),
    "a parent queue": (
        queue({"parent": "eng", "deserved": {GPU: 8}}),
        ("h100",),
        "spec.parent",
    ),
    "not a quantity": (
        queue({"deserved": {"cpu": "lots"}}),
        ("h100",),
        "spec.deserved.cpu",
    ),
}


@pytest.mark.parametrize(("body", "flavors", "field"), REFUSALS.values(), ids=list(REFUSALS))
def test_a_queue_that_maps_to_none_is_refused_naming_the_field(
    body: dict[str, Any], flavors: tuple[str, ...], field: str
) -> None:
    with pytest.raises(QueueRefused) as refused:
        volcano_queue_to_cluster_queue(body, lambda: list(flavors))
    assert refused.value.field == field
    assert str(refused.value).startswith(f"Volcano Queue q: {field}: ")
