"""Writes copy what they change and nothing else, and what they store is their own.

The write paths skip copies where they can (a status merge patch builds the new
object from one copy, an apply-create stores its own copy of the applied
configuration, a deletion without finalizers copies nothing): each case here
checks the shortcut against the long way round, and that no stored state —
the new object, the old one (watch history and ``prev`` of events hold it) —
shares a mutable part with a request body or changes after the write.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client

from sim.kubesim.api import (
    APPLY_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    ApiCore,
    Context,
    Resource,
)
from sim.kubesim.cluster import ClusterOptions, SimCluster

NS = "default"
Obj = dict[str, Any]


@pytest.fixture
def cluster() -> SimCluster:
    return SimCluster(ClusterOptions(name="copies", controllers=False))


def _jobs(core: ApiCore) -> Resource:
    return core.resource("batch", "v1", "jobs")


def _job(name: str) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app": "copies"}},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox:1", "args": ["a", "b"]}],
                }
            },
        },
    }


def _status() -> Obj:
    return {
        "status": {
            "succeeded": 1,
            "conditions": [{"type": "Complete", "status": "True", "reason": "Done"}],
        }
    }


def _identity_free(obj: Obj) -> Obj:
    """``obj`` without what differs between two objects written the same way."""
    metadata = obj["metadata"]
    text = json.dumps(obj)
    for value in (metadata["name"], metadata["uid"], metadata["creationTimestamp"]):
        text = text.replace(json.dumps(value), '"-"')
    out: Obj = json.loads(text)
    out["metadata"]["resourceVersion"] = "-"
    for entry in out["metadata"]["managedFields"]:
        entry["time"] = "-"
    return out


@pytest.mark.parametrize("kind", [MERGE_PATCH, STRATEGIC_PATCH])
def test_a_status_merge_patch_stores_what_the_general_path_stores(
    cluster: SimCluster, kind: str
) -> None:
    core, jobs = cluster.core, _jobs(cluster.core)
    ctx = Context(manager="kubelet")
    for name in ("short", "long"):
        core.create(jobs, NS, _job(name), Context(manager="maker"))
    short = core.patch(jobs, NS, "short", kind, _status(), ctx, subresource="status")
    # A metadata key in the patch takes the general path (and is ignored on /status).
    general = {**_status(), "metadata": {"labels": {"app": "ignored"}}}
    long = core.patch(jobs, NS, "long", kind, general, ctx, subresource="status")
    assert short["status"] == _status()["status"]
    assert long["metadata"]["labels"] == {"app": "copies"}
    assert _identity_free(short) == _identity_free(long)
    assert list(short) == list(long) and list(short["metadata"]) == list(long["metadata"])


@pytest.mark.parametrize("kind", [MERGE_PATCH, STRATEGIC_PATCH])
def test_a_status_merge_patch_ignores_the_spec_and_leaves_the_old_object_alone(
    cluster: SimCluster, kind: str
) -> None:
    core, jobs = cluster.core, _jobs(cluster.core)
    old = core.create(jobs, NS, _job("alone"), Context(manager="maker"))
    before = copy.deepcopy(old)
    body = _status()
    new = core.patch(jobs, NS, "alone", kind, body, Context(manager="k"), subresource="status")
    assert old == before, "the stored old object (an event's prev) changed"
    assert new["spec"] == old["spec"] and new["spec"] is not old["spec"]
    body["status"]["conditions"][0]["status"] = "False"
    body["status"]["succeeded"] = 7
    stored = core.get(jobs, NS, "alone")
    assert stored["status"] == _status()["status"], "the stored object aliases the request"
    new["spec"]["template"]["spec"]["containers"][0]["args"].append("c")
    assert old["spec"]["template"]["spec"]["containers"][0]["args"] == ["a", "b"]


def test_an_applied_creation_keeps_no_part_of_the_request(cluster: SimCluster) -> None:
    core, jobs = cluster.core, _jobs(cluster.core)
    body = _job("applied")
    created = core.patch(jobs, NS, "applied", APPLY_PATCH, body, Context(manager="qm"))
    body["metadata"]["labels"]["app"] = "changed"
    body["spec"]["template"]["spec"]["containers"][0]["args"].append("c")
    stored = core.get(jobs, NS, "applied")
    assert stored is created
    assert stored["metadata"]["labels"] == {"app": "copies"}
    assert stored["spec"]["template"]["spec"]["containers"][0]["args"] == ["a", "b"]
    assert "managedFields" not in body["metadata"] and "uid" not in body["metadata"]


def test_a_deletion_without_finalizers_leaves_the_last_state_unchanged(
    cluster: SimCluster,
) -> None:
    core, jobs = cluster.core, _jobs(cluster.core)
    stored = core.create(jobs, NS, _job("gone"), Context(manager="maker"))
    before = copy.deepcopy(stored)
    deleted, gone = core.delete(jobs, NS, "gone", Context(), propagation="Background")
    assert gone and core.store.get(jobs.rtype, NS, "gone") is None
    assert stored == before
    assert int(deleted["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    assert {**deleted["metadata"], "resourceVersion": ""} == {
        **before["metadata"],
        "resourceVersion": "",
    }


def test_a_deletion_that_waits_for_finalizers_writes_a_copy(cluster: SimCluster) -> None:
    core, jobs = cluster.core, _jobs(cluster.core)
    job = _job("held")
    job["metadata"]["finalizers"] = ["example.com/hold"]
    stored = core.create(jobs, NS, job, Context(manager="maker"))
    before = copy.deepcopy(stored)
    deleting, gone = core.delete(jobs, NS, "held", Context(), propagation="Background")
    assert not gone and deleting["metadata"]["deletionTimestamp"]
    assert stored == before and "deletionTimestamp" not in stored["metadata"]


ANCHORED = """
apiVersion: batch/v1
kind: Job
metadata:
  name: anchored
  labels: &labels {app: anchored}
spec:
  suspend: true
  template:
    metadata:
      labels: *labels
    spec:
      restartPolicy: Never
      containers: [{name: main, image: "busybox:1"}]
"""


def test_a_yaml_body_whose_anchors_repeat_a_node_is_stored_without_aliases(
    api: client.ApiClient,
) -> None:
    """The pod template's labels get the Job's generated ones; its metadata's must not."""
    params = api.param_serialize(
        method="PATCH",
        resource_path="/apis/batch/v1/namespaces/default/jobs/anchored",
        query_params=[("fieldManager", "yaml")],
        header_params={"Content-Type": APPLY_PATCH, "Accept": "application/json"},
        body=ANCHORED,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*params)
    response.read()
    assert response.status < 300, response.data
    stored = json.loads(response.data)
    assert stored["metadata"]["labels"] == {"app": "anchored"}
    assert "job-name" in stored["spec"]["template"]["metadata"]["labels"]
