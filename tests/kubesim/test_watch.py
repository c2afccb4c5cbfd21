"""Watches through the official client's ``watch.Watch``: replay, resumption, bookmarks, 410."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from sim.kubesim.testing import RunningCluster, running_cluster

NS = "default"


def _job(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Job no controller touches (``spec.managedBy`` elsewhere): only our writes show."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "managedBy": "example.com/elsewhere",
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox:1"}],
                }
            },
        },
    }


def _read(
    stream: Iterator[dict[str, Any]], w: watch.Watch, count: int
) -> list[tuple[str, str, int]]:
    """The first ``count`` events as (type, name, resourceVersion); then stop the watch."""
    events = []
    for event in stream:
        if event["type"] == "BOOKMARK":
            continue
        metadata = event["raw_object"]["metadata"]
        events.append((event["type"], metadata["name"], int(metadata["resourceVersion"])))
        if len(events) == count:
            w.stop()
    return events


def test_watch_from_a_list_replays_every_change_after_it(batch: client.BatchV1Api) -> None:
    rv = batch.list_namespaced_job(NS, label_selector="set=replay").metadata.resource_version
    labels = {"set": "replay"}
    for name in ("r-a", "r-b", "r-c"):
        batch.create_namespaced_job(NS, _job(name, labels))
    batch.patch_namespaced_job("r-a", NS, {"metadata": {"annotations": {"x": "1"}}})
    batch.delete_namespaced_job("r-b", NS)
    batch.create_namespaced_job(NS, _job("r-other"))  # outside the selector
    w = watch.Watch()
    stream = w.stream(
        batch.list_namespaced_job,
        NS,
        label_selector="set=replay",
        resource_version=rv,
        timeout_seconds=5,
    )
    events = _read(stream, w, 5)
    assert [(kind, name) for kind, name, _ in events] == [
        ("ADDED", "r-a"),
        ("ADDED", "r-b"),
        ("ADDED", "r-c"),
        ("MODIFIED", "r-a"),
        ("DELETED", "r-b"),
    ]
    revisions = [rv for _, _, rv in events]
    assert revisions == sorted(revisions) and len(set(revisions)) == 5


def test_watch_resumed_from_its_last_resource_version_misses_nothing(
    batch: client.BatchV1Api,
) -> None:
    """A writer keeps creating while a reader drops its watch every few events and resumes."""
    total = 80
    rv = batch.list_namespaced_job(NS, label_selector="set=resume").metadata.resource_version
    written: list[str] = []
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            for index in range(total):
                name = f"w-{index:03d}"
                batch.create_namespaced_job(NS, _job(name, {"set": "resume"}))
                written.append(name)
        except BaseException as error:  # surfaced by the assertion below
            failures.append(error)

    thread = threading.Thread(target=writer)
    thread.start()
    seen: list[tuple[str, str, int]] = []
    last = rv
    resumptions = 0
    while len(seen) < total:
        w = watch.Watch()
        stream = w.stream(
            batch.list_namespaced_job,
            NS,
            label_selector="set=resume",
            resource_version=last,
            timeout_seconds=10,
        )
        batch_of = _read(stream, w, min(6, total - len(seen)))
        assert batch_of, "a watch ended without delivering the pending events"
        seen.extend(batch_of)
        last = str(batch_of[-1][2])
        resumptions += 1
    thread.join(timeout=30)
    assert not failures
    assert resumptions >= total // 6
    assert [name for _, name, _ in seen] == written  # every creation, once, in order
    assert all(kind == "ADDED" for kind, _, _ in seen)
    revisions = [rv for _, _, rv in seen]
    assert revisions == sorted(set(revisions))


def test_watch_sends_live_events_to_several_watchers(
    batch: client.BatchV1Api, sim: RunningCluster
) -> None:
    rv = batch.list_namespaced_job(NS).metadata.resource_version
    results: list[list[tuple[str, str, int]]] = [[], []]

    def follow(slot: int) -> None:
        with sim.api_client() as api_client:
            own = client.BatchV1Api(api_client)
            w = watch.Watch()
            stream = w.stream(
                own.list_namespaced_job,
                NS,
                field_selector="metadata.name=live-one",
                resource_version=rv,
                timeout_seconds=10,
            )
            results[slot] = _read(stream, w, 2)

    threads = [threading.Thread(target=follow, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    batch.create_namespaced_job(NS, _job("live-one"))
    batch.delete_namespaced_job("live-one", NS)
    for thread in threads:
        thread.join(timeout=15)
    expected = [("ADDED", "live-one"), ("DELETED", "live-one")]
    assert [[(k, n) for k, n, _ in r] for r in results] == [expected, expected]


# -- a cluster with a short history: compaction ------------------------------------------------


@pytest.fixture(scope="module")
def short_history() -> Iterator[RunningCluster]:
    with running_cluster(
        name="compact", controllers=False, tls=False, history_size=10, bookmark_interval=0.2
    ) as cluster:
        yield cluster


def test_too_old_resource_version_is_410_gone(short_history: RunningCluster) -> None:
    with short_history.api_client() as api_client:
        batch = client.BatchV1Api(api_client)
        first = batch.create_namespaced_job(NS, _job("old-0")).metadata.resource_version
        batch.create_namespaced_job(NS, _job("old-1"))
        page = batch.list_namespaced_job(NS, limit=1)
        assert page.metadata._continue
        for index in range(2, 30):
            batch.create_namespaced_job(NS, _job(f"old-{index}"))

        w = watch.Watch()
        with pytest.raises(ApiException) as gone:
            list(w.stream(batch.list_namespaced_job, NS, resource_version=first, timeout_seconds=5))
        assert gone.value.status == 410
        assert "too old resource version" in str(gone.value.reason)

        with pytest.raises(ApiException) as expired:
            batch.list_namespaced_job(NS, limit=1, _continue=page.metadata._continue)
        assert expired.value.status == 410

        # Recovery, as the client documentation says: list again, watch from that list.
        fresh = batch.list_namespaced_job(NS)
        assert len(fresh.items) == 30
        w = watch.Watch()
        stream = w.stream(
            batch.list_namespaced_job,
            NS,
            resource_version=fresh.metadata.resource_version,
            timeout_seconds=5,
        )
        batch.create_namespaced_job(NS, _job("after"))
        assert [(k, n) for k, n, _ in _read(stream, w, 1)] == [("ADDED", "after")]


def test_bookmarks_carry_the_current_resource_version(short_history: RunningCluster) -> None:
    with short_history.api_client() as api_client:
        batch = client.BatchV1Api(api_client)
        latest = int(batch.list_namespaced_job(NS).metadata.resource_version)
        w = watch.Watch()
        bookmark = None
        for event in w.stream(
            batch.list_namespaced_job,
            NS,
            field_selector="metadata.name=nothing-here",
            resource_version=str(latest),
            allow_watch_bookmarks=True,
            timeout_seconds=5,
        ):
            if event["type"] == "BOOKMARK":
                bookmark = event["raw_object"]
                w.stop()
        assert bookmark is not None and bookmark["kind"] == "Job"
        assert int(bookmark["metadata"]["resourceVersion"]) >= latest
        assert int(w.resource_version) >= latest
