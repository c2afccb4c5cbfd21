"""What the member clusters ran: :class:`MemberWatch` follows the stand-ins'
Jobs, Pods and Nodes through the official client's watches."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes import watch

from service.runtime.demo import StandIn
from tests.waiting import wait_for as wait_until
from tests.workers.stack.names import ADMISSION_LABEL, GPU, ISLAND, WORKLOAD_LABEL


def cut_short(watcher: Any) -> None:
    """End ``watcher``'s stream now, from another thread: the socket under the
    response it reads (``Watch._resp``) is shut down. ``Watch.stop`` is seen
    only at the next event, and a quiet stream ends only at its
    ``timeout_seconds``: every test's watches would otherwise take that
    long to close."""
    response = getattr(watcher, "_resp", None)
    if response is not None:
        with contextlib.suppress(Exception):
            response.shutdown()


@dataclass
class PodRecord:
    cluster: str
    namespace: str
    name: str
    workload: str
    admission: str
    gpus: int
    node: str | None = None
    phases: set[str] = field(default_factory=set)
    created: float = 0.0
    deleted: float | None = None
    #: (wall time, event, phase, node, resourceVersion, terminating) of every event seen.
    history: list[tuple[float, str, str, str | None, str, bool]] = field(default_factory=list)


@dataclass
class JobRecord:
    cluster: str
    namespace: str
    name: str
    admission: str
    uid: str
    created: float
    deleted: float | None = None


def _gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or ():
        requests = (container.get("resources") or {}).get("requests") or {}
        total += int(requests.get(GPU, 0))
    return total


class MemberWatch:
    """Follows Jobs and Pods on every stand-in through watches (resumed
    after a break), keeping every pod and job ever seen and checking, at
    every pod event, that no node holds more GPUs than it has."""

    def __init__(self, members: Iterable[StandIn], kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.members = list(members)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.pods: dict[tuple[str, str, str], PodRecord] = {}
        self.jobs: dict[tuple[str, str, str], JobRecord] = {}
        #: Every job object ever created, in the order seen.
        self.job_history: list[JobRecord] = []
        self.node_island: dict[tuple[str, str], str] = {}
        self.node_gpus: dict[tuple[str, str], int] = {}
        self.overcommits: list[str] = []
        self.errors: list[str] = []
        self.on_job: Callable[[JobRecord], None] | None = None
        self._bound: dict[tuple[str, str], dict[tuple[str, str, str], int]] = {}
        self._threads: list[threading.Thread] = []
        self._synced: set[tuple[str, str]] = set()
        #: Each stream's current watch, by (cluster, kind), cut short on closing.
        self._watchers: dict[tuple[str, str], Any] = {}

    def _client(self, member: StandIn) -> Any:
        """The official client's ApiClient for ``member`` (untyped library)."""
        new_client: Any = kubernetes.config.new_client_from_config
        return new_client(config_file=str(self.kubeconfig), context=member.name)

    def start(self) -> MemberWatch:
        for member in self.members:
            with self._client(member) as api:
                nodes: Any = kubernetes.client.CoreV1Api(api).list_node(_preload_content=False)
                for node in json.loads(nodes.data)["items"]:
                    key = (member.name, node["metadata"]["name"])
                    self.node_island[key] = (node["metadata"].get("labels") or {}).get(ISLAND, "")
                    self.node_gpus[key] = int(node["status"]["allocatable"].get(GPU, 0))
            for kind in ("pods", "jobs"):
                thread = threading.Thread(
                    target=self._follow,
                    args=(member, kind),
                    daemon=True,
                    name=f"{member.name}-{kind}",
                )
                thread.start()
                self._threads.append(thread)
        wait_until(lambda: len(self._synced) == 2 * len(self.members), 60, "member watches")
        return self

    def close(self) -> None:
        self.stop.set()
        with self.lock:
            watchers = list(self._watchers.values())
        for watcher in watchers:
            cut_short(watcher)
        for thread in self._threads:
            thread.join(10)

    def __enter__(self) -> MemberWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _follow(self, member: StandIn, kind: str) -> None:
        api = self._client(member)
        lister: Any
        if kind == "pods":
            lister = kubernetes.client.CoreV1Api(api).list_pod_for_all_namespaces
        else:
            lister = kubernetes.client.BatchV1Api(api).list_job_for_all_namespaces
        selector = ADMISSION_LABEL
        version = None
        try:
            while not self.stop.is_set():
                try:
                    if version is None:
                        listed = json.loads(
                            lister(label_selector=selector, _preload_content=False).data
                        )
                        self._relisted(member.name, kind, listed["items"])
                        version = listed["metadata"]["resourceVersion"]
                        self._synced.add((member.name, kind))
                    watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
                    with self.lock:
                        self._watchers[member.name, kind] = watcher
                    stream = watcher.stream(
                        lister,
                        label_selector=selector,
                        resource_version=version,
                        allow_watch_bookmarks=True,
                        timeout_seconds=5,
                        deserialize=False,
                        _request_timeout=(2, 15),
                    )
                    for event in stream:
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            if obj.get("code") == 410:
                                version = None
                                break
                            raise RuntimeError(f"watch error: {obj}")
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self._seen(member.name, kind, event["type"], obj)
                        if self.stop.is_set():
                            break
                except kubernetes.client.exceptions.ApiException as error:
                    if error.status == 410:
                        version = None  # too old: list again
                    else:
                        self._error(member.name, kind, error)
                        self.stop.wait(0.5)
                except Exception as error:  # a broken stream: resume where it was
                    self._error(member.name, kind, error)
                    self.stop.wait(0.5)
        finally:
            api.close()

    def _relisted(self, cluster: str, kind: str, items: list[dict[str, Any]]) -> None:
        """A fresh list (at the start, or after the watch fell too far
        behind): what is no longer there was deleted meanwhile."""
        listed = {(cluster, o["metadata"]["namespace"], o["metadata"]["name"]) for o in items}
        now = time.time()
        with self.lock:
            known = self.pods if kind == "pods" else self.jobs
            for key, record in known.items():
                if key[0] == cluster and key not in listed and record.deleted is None:
                    record.deleted = now
                    if isinstance(record, PodRecord):
                        self._account(cluster, (key[1], key[2]), record, live=False)
        for obj in items:
            self._seen(cluster, kind, "ADDED", obj)

    def _error(self, cluster: str, kind: str, error: Exception) -> None:
        if self.stop.is_set():
            return  # the stream we cut short on closing
        with self.lock:
            self.errors.append(f"{cluster} {kind}: {type(error).__name__}: {error}"[:300])

    def _seen(self, cluster: str, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        now = time.time()  # wall clock: compared with what Postgres records
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        key = (cluster, namespace, name)
        with self.lock:
            if kind == "jobs":
                job = self.jobs.get(key)
                if job is None or job.uid != uid:
                    admission = labels.get(ADMISSION_LABEL, "")
                    job = JobRecord(cluster, namespace, name, admission, uid, now)
                    self.jobs[key] = job
                    self.job_history.append(job)
                    if self.on_job is not None:
                        self.on_job(job)
                if event == "DELETED":
                    job.deleted = now
                return
            pod = self.pods.get(key)
            if pod is None or pod.admission != labels.get(ADMISSION_LABEL, ""):
                pod = PodRecord(
                    cluster,
                    namespace,
                    name,
                    labels.get(WORKLOAD_LABEL, ""),
                    labels.get(ADMISSION_LABEL, ""),
                    _gpus(obj),
                    created=now,
                )
                self.pods[key] = pod
            phase = (obj.get("status") or {}).get("phase") or "Pending"
            pod.phases.add(phase)
            node = (obj.get("spec") or {}).get("nodeName")
            if node:
                pod.node = node
            pod.history.append(
                (
                    now,
                    event,
                    phase,
                    node,
                    meta["resourceVersion"],
                    bool(meta.get("deletionTimestamp")),
                )
            )
            live = event != "DELETED" and phase not in ("Succeeded", "Failed")
            if event == "DELETED":
                pod.deleted = now
            self._account(cluster, (namespace, name), pod, live)

    def _account(self, cluster: str, key: tuple[str, str], pod: PodRecord, live: bool) -> None:
        ref = (cluster, *key)
        for node_pods in self._bound.values():
            node_pods.pop(ref, None)
        if not live or pod.node is None:
            return
        node = (cluster, pod.node)
        bound = self._bound.setdefault(node, {})
        bound[ref] = pod.gpus
        used = sum(bound.values())
        if used > self.node_gpus.get(node, 0):
            holders = "; ".join(f"{k[2]} {self.pods[k].history}" for k in bound)
            self.overcommits.append(f"{cluster}/{pod.node}: {used} GPUs bound to {holders}")

    # -- questions -----------------------------------------------------------------------

    def listed(self) -> dict[str, set[tuple[str, str, str]]]:
        """What the members hold now, by a fresh list (not the watches):
        ``{"pods": {(cluster, namespace, name)}, "jobs": {...}}``."""
        out: dict[str, set[tuple[str, str, str]]] = {"pods": set(), "jobs": set()}
        for member in self.members:
            with self._client(member) as api:
                for kind, lister in (
                    ("pods", kubernetes.client.CoreV1Api(api).list_pod_for_all_namespaces),
                    ("jobs", kubernetes.client.BatchV1Api(api).list_job_for_all_namespaces),
                ):
                    raw: Any = lister(label_selector=ADMISSION_LABEL, _preload_content=False)
                    for obj in json.loads(raw.data)["items"]:
                        meta = obj["metadata"]
                        out[kind].add((member.name, meta["namespace"], meta["name"]))
        return out

    def unseen(self) -> list[str]:
        """Where the watches disagree with a fresh list (events missed)."""
        listed = self.listed()
        with self.lock:
            alive = {
                "pods": {k for k, p in self.pods.items() if p.deleted is None},
                "jobs": {k for k, j in self.jobs.items() if j.deleted is None},
            }
        said = {True: "listed, not watched", False: "watched, not listed"}
        return [
            f"{kind} {key}: {said[key in listed[kind]]}"
            for kind in ("pods", "jobs")
            for key in sorted(listed[kind] ^ alive[kind])
        ]

    def pods_of(self, workload: str) -> list[PodRecord]:
        """Every pod seen of a workload (``namespace.name`` label)."""
        with self.lock:
            return [p for p in self.pods.values() if p.workload == workload]

    def straddlers(self) -> list[str]:
        """Admissions whose pods ran in more than one island (or cluster)."""
        islands: dict[str, set[tuple[str, str]]] = {}
        with self.lock:
            for pod in self.pods.values():
                if pod.node is not None:
                    island = self.node_island.get((pod.cluster, pod.node), "?")
                    islands.setdefault(pod.admission, set()).add((pod.cluster, island))
        return sorted(f"{a}: {sorted(i)}" for a, i in islands.items() if len(i) > 1)
