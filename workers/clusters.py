"""The member-cluster adapter: one official ``kubernetes`` ApiClient per
cluster, with a client-side rate limit and timeouts set deliberately.

The Python client has no rate limiter of its own; client-go's default of
5 QPS / burst 10 is what capped Kueue MultiKueue's benchmark at 1.3
workloads/s (kubernetes-sigs/kueue#8564), so ours is a token bucket sized by
``QM_MEMBER_QPS`` / ``QM_MEMBER_BURST``, and every request carries a
``(connect, read)`` timeout so a partitioned cluster fails fast instead of
holding a worker.

Writes are server-side apply (``application/apply-patch+yaml``, field
manager ``quartermaster``, ``force``), so applying the same object twice is a
no-op and a crash between writes repeats nothing harmful.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

import kubernetes
import yaml

# Imported here, not on first use: the client loads its API modules lazily,
# and CoreV1Api alone takes seconds of CPU; a Celery worker imports this
# module before it forks, so its pool processes share the import.
from kubernetes.client import ApisApi, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from workers.jsonio import dumps, loads
from workers.plan.views import Ref

__all__ = [
    "APPLY",
    "FIELD_MANAGER",
    "KINDS",
    "Kind",
    "Member",
    "MemberError",
    "RateLimiter",
    "Ref",
    "configuration",
    "discovered_backend",
]

FIELD_MANAGER = "quartermaster"
APPLY = "application/apply-patch+yaml"
Obj = dict[str, Any]


class MemberError(Exception):
    """The member cluster could not be reached or refused a request
    (``status``: the HTTP status of a refusal, ``None`` when unreachable)."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body

    @property
    def refused(self) -> bool:
        """The member understood and refused (invalid, unknown kind): asking
        again will not help. A 403 is not one: RBAC gets fixed, and a gang
        should not be evicted for an operator's slip."""
        return self.status in (400, 404, 422)


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


KINDS: dict[str, Kind] = {
    k.kind: k
    for k in (
        Kind("v1", "Namespace", "namespaces", False),
        Kind("kueue.x-k8s.io/v1beta2", "ResourceFlavor", "resourceflavors", False),
        Kind("kueue.x-k8s.io/v1beta2", "ClusterQueue", "clusterqueues", False),
        Kind("kueue.x-k8s.io/v1beta2", "LocalQueue", "localqueues", True),
        Kind("kueue.x-k8s.io/v1beta2", "Workload", "workloads", True),
        Kind("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass", "workloadpriorityclasses", False),
        Kind("batch/v1", "Job", "jobs", True),
        Kind("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets", True),
        Kind("kubeflow.org/v1", "PyTorchJob", "pytorchjobs", True),
        Kind("kubeflow.org/v2beta1", "MPIJob", "mpijobs", True),
        Kind("ray.io/v1", "RayJob", "rayjobs", True),
        Kind("ray.io/v1", "RayCluster", "rayclusters", True),
        Kind("apps/v1", "Deployment", "deployments", True),
        Kind("apps/v1", "StatefulSet", "statefulsets", True),
        Kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets", True),
        Kind("coordination.k8s.io/v1", "Lease", "leases", True),  # workers/fence.py
        # A Volcano member's (workers/plan/volcano.py).
        Kind("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", False),
        Kind("scheduling.volcano.sh/v1beta1", "Queue", "queues", False),
        Kind("scheduling.volcano.sh/v1beta1", "PodGroup", "podgroups", True),
        Kind("topology.volcano.sh/v1alpha1", "HyperNode", "hypernodes", False),
        # Asks Volcano's queue controller to close a Queue (workers/collect.py).
        Kind("bus.volcano.sh/v1alpha1", "Command", "commands", True),
    )
}


#: The API group that tells each backend's members apart (``/apis``): a Kueue
#: member serves Kueue's CRDs, a Volcano member Volcano's scheduling ones.
BACKEND_GROUPS = (("kueue", "kueue.x-k8s.io"), ("volcano", "scheduling.volcano.sh"))


def discovered_backend(groups: Iterable[str]) -> str | None:
    """The backend whose API group a member serves (Kueue first, where one
    serves both: it was the only backend before Volcano's); none if neither."""
    served = set(groups)
    return next((backend for backend, group in BACKEND_GROUPS if group in served), None)


class RateLimiter:
    """A token bucket: ``qps`` tokens a second, at most ``burst`` saved."""

    def __init__(self, qps: float, burst: int) -> None:
        self._qps = qps
        self._burst = float(max(1, burst))
        self._tokens = self._burst
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._qps)
            self._at = now
            self._tokens -= 1.0
            wait = -self._tokens / self._qps if self._tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


def configuration(
    spec: Mapping[str, Any], secret: Mapping[str, Any] | None
) -> kubernetes.client.Configuration:
    """An ApiClient configuration from a Cluster's spec and its decrypted
    credentials (``{token}`` or ``{kubeconfig}``)."""
    config = kubernetes.client.Configuration()
    secret = secret or {}
    if secret.get("kubeconfig"):
        kube_config: Any = kubernetes.config.kube_config
        loader = kube_config.KubeConfigLoader(config_dict=yaml.safe_load(secret["kubeconfig"]))
        loader.load_and_set(config)
    if spec.get("server"):
        config.host = str(spec["server"]).rstrip("/")
    if secret.get("token"):
        config.api_key = {"authorization": f"Bearer {secret['token']}"}
    if spec.get("insecureSkipTLSVerify"):
        config.verify_ssl = False
    elif spec.get("caData"):
        config.ca_cert_data = _pem(str(spec["caData"]))
    config.retries = 0  # our own loops retry; urllib3's would hide a partition
    return config


def _pem(data: str) -> str:
    """``caData`` as PEM text (it may be given base64-encoded, as in a
    kubeconfig); handed to the client in memory, never written to a file."""
    return data if "BEGIN CERTIFICATE" in data else base64.b64decode(data).decode()


def _object_path(k: Kind) -> str:
    """The path of one object of kind ``k``, as the client's generated
    methods name it (placeholders filled from :func:`_path_params`)."""
    root = "/api/v1" if k.api_version == "v1" else "/apis/{group}/{version}"
    where = "/namespaces/{namespace}" if k.namespaced else ""
    return f"{root}{where}/{{plural}}/{{name}}"


def _path_params(k: Kind, ref: Ref) -> dict[str, str]:
    params = {"group": k.group, "version": k.version, "plural": k.plural, "name": ref.name}
    if k.namespaced:
        params["namespace"] = ref.namespace
    return params


class Member:
    """One member cluster's API, rate-limited, every call with a timeout."""

    def __init__(
        self,
        name: str,
        config: kubernetes.client.Configuration,
        *,
        qps: float = 50.0,
        burst: int = 100,
        timeout: tuple[float, float] = (5.0, 30.0),
    ) -> None:
        self.name = name
        self.api = kubernetes.client.ApiClient(config)
        self.limiter = RateLimiter(qps, burst)
        self.timeout = timeout
        self._custom = CustomObjectsApi(self.api)
        self._core = CoreV1Api(self.api)

    def close(self) -> None:
        api: Any = self.api
        api.close()

    @contextmanager
    def _call(self, what: str) -> Iterator[None]:
        self.limiter.acquire()
        try:
            yield
        except ApiException as error:
            raise MemberError(
                f"{self.name}: {what}: {error.status} {error.reason}",
                error.status,
                str(error.body or "")[:2000],
            ) from error
        except (OSError, kubernetes.client.exceptions.OpenApiException) as error:
            raise MemberError(f"{self.name}: {what}: {error!r}") from error
        except Exception as error:  # urllib3 errors are not all OSErrors
            if type(error).__module__.startswith("urllib3"):
                raise MemberError(f"{self.name}: {what}: {error!r}") from error
            raise

    # -- reads ---------------------------------------------------------------------------

    def list_objects(self, kind: str, label_selector: str | None = None) -> list[Obj]:
        """Every object of ``kind`` (all namespaces); a kind the cluster does
        not serve is an empty list."""
        k = KINDS[kind]
        raw: Any
        with self._call(f"list {k.plural}"):
            try:
                if k.kind == "Namespace" or k.api_version == "v1":
                    raw = self._core.list_namespace(
                        label_selector=label_selector,
                        _preload_content=False,
                        _request_timeout=self.timeout,
                    )
                else:
                    raw = self._custom.list_cluster_custom_object(
                        k.group,
                        k.version,
                        k.plural,
                        label_selector=label_selector,
                        _preload_content=False,
                        _request_timeout=self.timeout,
                    )
            except ApiException as error:
                if error.status == 404:
                    return []
                raise
            body = loads(raw.data)
        items: list[Obj] = body.get("items") or []
        for item in items:
            item.setdefault("kind", k.kind)
            item.setdefault("apiVersion", k.api_version)
        return items

    def nodes(self) -> list[Obj]:
        return self.dated_nodes()[0]

    def dated_nodes(self) -> tuple[list[Obj], datetime | None]:
        """The Nodes, and the member's own time of the answer (its ``Date``
        header, whole seconds): the member clock that a lost member's
        estimate of what ran ends at."""
        with self._call("list nodes"):
            raw: Any = self._core.list_node(_preload_content=False, _request_timeout=self.timeout)
            items: list[Obj] = loads(raw.data).get("items") or []
            date = (raw.headers or {}).get("Date")
        try:
            return items, parsedate_to_datetime(date) if date else None
        except (TypeError, ValueError):
            return items, None

    def api_groups(self) -> list[str]:
        """The API groups the member serves (discovery, ``GET /apis``)."""
        with self._call("discover api groups"):
            found: Any = ApisApi(self.api).get_api_versions(_request_timeout=self.timeout)
        return [str(group.name) for group in found.groups or ()]

    def backend(self) -> str | None:
        """The admission backend the member serves, by discovery."""
        return discovered_backend(self.api_groups())

    def exists(self, ref: Ref) -> bool:
        return self.read(ref) is not None

    def read(self, ref: Ref) -> Obj | None:
        """The object ``ref`` names (a ``get``), or ``None`` when it is not there."""
        k = KINDS[ref.kind]
        raw: Any
        with self._call(f"get {ref}"):
            try:
                if k.api_version == "v1":
                    raw = self._core.read_namespace(
                        ref.name, _preload_content=False, _request_timeout=self.timeout
                    )
                elif k.namespaced:
                    raw = self._custom.get_namespaced_custom_object(
                        k.group,
                        k.version,
                        ref.namespace,
                        k.plural,
                        ref.name,
                        _preload_content=False,
                        _request_timeout=self.timeout,
                    )
                else:
                    raw = self._custom.get_cluster_custom_object(
                        k.group,
                        k.version,
                        k.plural,
                        ref.name,
                        _preload_content=False,
                        _request_timeout=self.timeout,
                    )
            except ApiException as error:
                if error.status == 404:
                    return None
                raise
            found: Obj = loads(raw.data)
        return found

    # -- writes --------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any]) -> None:
        """Server-side apply, forced: we own the fields we set.

        The body goes as JSON text (JSON is YAML) written here, through the
        client's own request building and REST layer: handed a dict, its
        generated method validated it, walked it and encoded it again with
        the standard library, a tenth of a millisecond for every job
        dispatched. The answer (the object as stored) is read to the end,
        not decoded."""
        ref = Ref.of(obj)
        request = self.api.param_serialize(
            method="PATCH",
            resource_path=_object_path(KINDS[ref.kind]),
            path_params=_path_params(KINDS[ref.kind], ref),
            query_params=[
                ("fieldManager", FIELD_MANAGER),
                ("force", True),
                # An unknown field is an error, not a warning: what we write
                # is exactly what the member stores, and the CRDs check it.
                ("fieldValidation", "Strict"),
            ],
            header_params={"Accept": "application/json", "Content-Type": APPLY},
            body=dumps(dict(obj)),
            auth_settings=["BearerToken"],
        )
        with self._call(f"apply {ref}"):
            answer: Any = self.api.call_api(*request, _request_timeout=self.timeout)
            answer.read()  # to the end: the connection goes back to the pool
            answer.response.release_conn()
            if not 200 <= answer.status <= 299:
                raise ApiException.from_response(http_resp=answer, body=None, data=None)

    def pods(self, label_selector: str, field_selector: str | None = None) -> list[Obj]:
        with self._call("list pods"):
            raw: Any = self._core.list_pod_for_all_namespaces(
                label_selector=label_selector,
                field_selector=field_selector,
                _preload_content=False,
                _request_timeout=self.timeout,
            )
            items: list[Obj] = loads(raw.data).get("items") or []
        return items

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """A strategic merge patch of one pod (its finalizers merge as a set:
        ours come and go without touching the job controller's); one
        already gone is done."""
        with self._call(f"patch pod {namespace}/{name}"):
            try:
                raw: Any = self._core.patch_namespaced_pod(
                    name,
                    namespace,
                    dict(patch),
                    _content_type="application/strategic-merge-patch+json",
                    _preload_content=False,
                    _request_timeout=self.timeout,
                )
            except ApiException as error:
                if error.status != 404:
                    raise
                return
            raw.data  # noqa: B018  (read to the end: the connection goes back to the pool)
            raw.release_conn()

    def scale(self, ref: Ref, replicas: int) -> None:
        """Set ``ref``'s replicas through its ``scale`` subresource (a merge
        patch of the ``autoscaling/v1`` Scale): the object stays, its
        running replicas untouched, only the count moves."""
        k = KINDS[ref.kind]
        with self._call(f"scale {ref} to {replicas}"):
            raw: Any = self._custom.patch_namespaced_custom_object_scale(
                k.group,
                k.version,
                ref.namespace,
                k.plural,
                ref.name,
                {"spec": {"replicas": replicas}},
                field_manager=FIELD_MANAGER,
                _content_type="application/merge-patch+json",
                _preload_content=False,
                _request_timeout=self.timeout,
            )
            raw.data  # noqa: B018  (read to the end: the connection goes back to the pool)
            raw.release_conn()

    def delete(self, ref: Ref) -> None:
        """Background deletion: the object goes now, its pods after it (the
        caller waits for those by label: gone means the GPUs are free).
        Foreground would say the same in one object, but a job controller
        that keeps its tracking finalizer on a deleting job's pods never
        lets the owner go. Already gone is done."""
        k = KINDS[ref.kind]
        body = kubernetes.client.V1DeleteOptions(propagation_policy="Background")
        with self._call(f"delete {ref}"):
            try:
                if k.namespaced:
                    self._custom.delete_namespaced_custom_object(
                        k.group,
                        k.version,
                        ref.namespace,
                        k.plural,
                        ref.name,
                        body=body,
                        _request_timeout=self.timeout,
                    )
                else:
                    self._custom.delete_cluster_custom_object(
                        k.group,
                        k.version,
                        k.plural,
                        ref.name,
                        body=body,
                        _request_timeout=self.timeout,
                    )
            except ApiException as error:
                if error.status != 404:
                    raise

    def delete_labelled(self, kind: str, namespace: str, selector: str) -> None:
        """Background deletion of every ``kind`` in ``namespace`` that
        ``selector`` selects: one request for what would be one each (a
        pass removes every gang finished since the last, and a request per
        job was a fifth of a pass). The answer (the deleted objects) is read
        to the end, unparsed, so that the connection goes back to the pool."""
        k = KINDS[kind]
        with self._call(f"delete {k.plural} in {namespace} ({selector})"):
            try:
                raw: Any = self._custom.delete_collection_namespaced_custom_object(
                    k.group,
                    k.version,
                    namespace,
                    k.plural,
                    label_selector=selector,
                    propagation_policy="Background",
                    _preload_content=False,
                    _request_timeout=self.timeout,
                )
            except ApiException as error:
                if error.status != 404:
                    raise
                return
            raw.data  # noqa: B018
            raw.release_conn()

    def wait_gone(
        self, refs: list[Ref], pods: str | None, timeout: float, interval: float = 0.1
    ) -> list[str]:
        """Poll until every one of ``refs`` is gone, and every pod that
        ``pods`` (a label selector) selects; what is still there after
        ``timeout``."""
        left: list[Ref] = [*refs]
        deadline = time.monotonic() + timeout
        while True:
            left = [r for r in left if self.exists(r)]
            running = self.pods(pods) if pods and not left else []
            if (not left and not running) or time.monotonic() > deadline:
                break
            time.sleep(interval)
        return [str(r) for r in left] + [f"Pod {p['metadata']['name']}" for p in running]
