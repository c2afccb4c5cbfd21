"""The synchronous client.

```python
with Client.from_context() as qm:             # or Client(url, token=...)
    qm.clusterqueues.apply(cq)                # create or replace
    qm.submit(job, namespace="team-a")        # retried with one Idempotency-Key
    for w in qm.workloads.list(all_namespaces=True):   # every page
        ...
    for event in qm.watch(namespace="team-a"):          # resumes after drops
        ...
```
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import httpx

from quartermaster_client import _http
from quartermaster_client._http import (
    Call,
    KindLike,
    ObjectLike,
    Operations,
    RetryPolicy,
    SSEDecoder,
    base_headers,
    event_filters,
    watch_params,
    with_idempotency_key,
)
from quartermaster_client.apply import Applied, differs, kueue_to_quartermaster
from quartermaster_client.config import resolve as resolve_connection
from quartermaster_client.errors import (
    AlreadyExists,
    NotFound,
    StaleVersion,
    TransportError,
    WatchTimeout,
    error_for,
)
from quartermaster_client.kinds import BY_KIND, Kind, of_manifest, resolve
from quartermaster_client.models import (
    BulkResult,
    Cluster,
    ClusterQueue,
    Cohort,
    Event,
    Explanation,
    IssuedToken,
    LedgerEntry,
    LocalQueue,
    Page,
    Resource,
    ResourceFlavor,
    Topology,
    UsageRow,
    WhoAmI,
    Workload,
    WorkloadPriorityClass,
)
from quartermaster_client.outcomes import outcome
from quartermaster_client.volcano import is_volcano_queue, volcano_queue_to_cluster_queue

R = TypeVar("R", bound=Resource)
T = TypeVar("T")
WATCH_READ_TIMEOUT = 45.0  # the server sends a heartbeat every 15 s


class Resources(Generic[R]):
    """CRUD for one kind, typed: ``client.clusterqueues.get("cq-a")``."""

    def __init__(self, client: Client, kind: Kind) -> None:
        self._client = client
        self.kind = kind

    def get(self, name: str, namespace: str | None = None) -> R:
        return cast(R, self._client.get(self.kind, name, namespace))

    def list(
        self,
        namespace: str | None = None,
        *,
        all_namespaces: bool = False,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> Iterator[R]:
        return cast(
            Iterator[R],
            self._client.list(
                self.kind,
                namespace,
                all_namespaces=all_namespaces,
                label_selector=label_selector,
                field_selector=field_selector,
                page_size=page_size,
            ),
        )

    def create(self, obj: R | Mapping[str, Any], namespace: str | None = None) -> R:
        return cast(R, self._client.create(obj, namespace, kind=self.kind))

    def replace(
        self, obj: R | Mapping[str, Any], namespace: str | None = None, if_match: str | None = None
    ) -> R:
        return cast(R, self._client.replace(obj, namespace, if_match, kind=self.kind))

    def patch(
        self,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        if_match: str | None = None,
    ) -> R:
        return cast(R, self._client.patch(self.kind, name, patch, namespace, if_match))

    def delete(self, name: str, namespace: str | None = None, if_match: str | None = None) -> R:
        return cast(R, self._client.delete(self.kind, name, namespace, if_match))

    def apply(self, obj: R | Mapping[str, Any], namespace: str | None = None) -> Applied:
        return self._client.apply(obj, namespace, kind=self.kind)


class Client:
    """A Quartermaster API client: base URL and bearer token, or a context
    from the qmctl config file when neither is given."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        namespace: str | None = None,
        context: str | None = None,
        config_path: Path | str | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        verify: bool = True,
    ) -> None:
        if base_url is None or context is not None:
            found = resolve_connection(base_url, token, namespace, context, config_path)
            base_url, token, namespace = found.server, found.token, found.namespace
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.ops = Operations(namespace)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=base_headers(token),
            timeout=timeout,
            transport=transport,
            verify=verify,
        )
        self.resourceflavors: Resources[ResourceFlavor] = Resources(self, BY_KIND["ResourceFlavor"])
        self.topologies: Resources[Topology] = Resources(self, BY_KIND["Topology"])
        self.cohorts: Resources[Cohort] = Resources(self, BY_KIND["Cohort"])
        self.clusterqueues: Resources[ClusterQueue] = Resources(self, BY_KIND["ClusterQueue"])
        self.localqueues: Resources[LocalQueue] = Resources(self, BY_KIND["LocalQueue"])
        self.workloadpriorityclasses: Resources[WorkloadPriorityClass] = Resources(
            self, BY_KIND["WorkloadPriorityClass"]
        )
        self.clusters: Resources[Cluster] = Resources(self, BY_KIND["Cluster"])
        self.workloads: Resources[Workload] = Resources(self, BY_KIND["Workload"])

    @classmethod
    def from_context(
        cls, context: str | None = None, config_path: Path | str | None = None, **options: Any
    ) -> Client:
        found = resolve_connection(context=context, config_path=config_path)
        return cls(found.server, found.token, namespace=found.namespace, **options)

    @property
    def namespace(self) -> str | None:
        return self.ops.namespace

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sending -----------------------------------------------------------------------

    def send(self, request: httpx.Request, stream: bool = False) -> httpx.Response:
        """Send with retries: 429 and 503 (after Retry-After), connection
        failures, and 409 while our own Idempotency-Key is in flight."""
        request = with_idempotency_key(request)
        attempt = 0
        while True:
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as error:
                if attempt + 1 >= self.retry.attempts or not self.retry.retry_error(request, error):
                    raise TransportError(
                        f"{request.method} {request.url}: {type(error).__name__}: {error}"
                    ) from error
                time.sleep(self.retry.delay(attempt))
                attempt += 1
                continue
            if attempt + 1 < self.retry.attempts and self.retry.retry_response(request, response):
                response.read()
                response.close()
                time.sleep(self.retry.delay(attempt, response))
                attempt += 1
                continue
            return response

    def call(self, call: Call[T]) -> T:
        return call.result(self.send(call.request(self._http)))

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A raw request (with retries), for what the typed methods lack."""
        return self.send(self._http.build_request(method, path, **kwargs))

    # -- every kind --------------------------------------------------------------------

    def get(self, kind: KindLike, name: str, namespace: str | None = None) -> Resource:
        return self.call(self.ops.get(kind, name, namespace))

    def list_page(
        self,
        kind: KindLike,
        namespace: str | None = None,
        *,
        all_namespaces: bool = False,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> Page[Resource]:
        return self.call(
            self.ops.list_page(
                kind,
                namespace,
                all_namespaces,
                label_selector,
                field_selector,
                limit,
                continue_token,
            )
        )

    def list(
        self,
        kind: KindLike,
        namespace: str | None = None,
        *,
        all_namespaces: bool = False,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> Iterator[Resource]:
        """Every object, page after page (``continue`` tokens), lazily."""
        token: str | None = None
        while True:
            page = self.list_page(
                kind,
                namespace,
                all_namespaces=all_namespaces,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=page_size,
                continue_token=token,
            )
            yield from page.items
            token = page.continue_token
            if not token:
                return

    def create(
        self, obj: ObjectLike, namespace: str | None = None, kind: KindLike | None = None
    ) -> Resource:
        return self.call(self.ops.create(obj, namespace, kind))

    def replace(
        self,
        obj: ObjectLike,
        namespace: str | None = None,
        if_match: str | None = None,
        kind: KindLike | None = None,
    ) -> Resource:
        return self.call(self.ops.replace(obj, namespace, if_match, kind))

    def patch(
        self,
        kind: KindLike,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        if_match: str | None = None,
    ) -> Resource:
        return self.call(self.ops.patch(kind, name, patch, namespace, if_match))

    def delete(
        self,
        kind: KindLike,
        name: str,
        namespace: str | None = None,
        if_match: str | None = None,
    ) -> Resource:
        """Delete; for a workload, cancel it."""
        return self.call(self.ops.delete(kind, name, namespace, if_match))

    def apply(
        self, obj: ObjectLike, namespace: str | None = None, kind: KindLike | None = None
    ) -> Applied:
        """Create the object, or replace it when it exists and differs.
        Kueue manifests (``kueue.x-k8s.io/v1beta2``) are translated first, a
        Volcano Queue mapped to its ClusterQueue (quartermaster_client.volcano;
        QueueRefused when it maps to none). A workload is submitted; one that
        exists is left alone."""
        body, notes = kueue_to_quartermaster(_http.to_body(obj))
        if is_volcano_queue(body):
            body, notes = volcano_queue_to_cluster_queue(
                body, lambda: [f.name for f in self.resourceflavors.list()]
            )
        given = (str(body.get("apiVersion") or ""), str(body.get("kind", "")))
        k = resolve(kind) if kind is not None else of_manifest(*given)
        if k.kind == "Workload":
            try:
                return Applied(self.submit(body, namespace), "created", notes)
            except AlreadyExists:
                name = body["metadata"]["name"]
                ns = namespace or body["metadata"].get("namespace")
                return Applied(self.get(k, name, ns), "unchanged", notes)
        name = body["metadata"]["name"]
        for _ in range(3):
            try:
                current = self.get(k, name, namespace or body["metadata"].get("namespace"))
            except NotFound:
                try:
                    return Applied(self.create(body, namespace, kind=k), "created", notes)
                except AlreadyExists:
                    continue
            if not differs(body, current.to_dict()):
                return Applied(current, "unchanged", notes)
            try:
                replaced = self.replace(body, namespace, current.resource_version, kind=k)
            except StaleVersion:
                continue
            return Applied(replaced, "configured", notes)
        raise StaleVersion(409, "stale-version", "Conflict", f"{name} kept changing", [])

    # -- workloads ---------------------------------------------------------------------

    def submit(self, manifest: ObjectLike, namespace: str | None = None) -> Workload:
        """Submit a Workload, or a job manifest (Job, JobSet, PyTorchJob, MPIJob,
        RayJob, RayCluster, Deployment, StatefulSet, LeaderWorkerSet, Volcano Job)."""
        return self.call(self.ops.submit(manifest, namespace))

    def bulk_submit(
        self, items: builtins.list[ObjectLike], namespace: str | None = None
    ) -> BulkResult:
        """Up to 5,000 submissions in one request; each succeeds or fails alone."""
        return self.call(self.ops.bulk_submit(items, namespace))

    def cancel(self, name: str, namespace: str | None = None) -> Workload:
        return self.call(self.ops.cancel(name, namespace))

    def scale(self, name: str, replicas: int, namespace: str | None = None) -> dict[str, Any]:
        """Set a serving workload's replicas; answers its Scale (``spec.replicas``
        asked, ``status.replicas`` admitted)."""
        return self.call(self.ops.scale(name, replicas, namespace))

    def explain(self, name: str, namespace: str | None = None) -> Explanation:
        return self.call(self.ops.explain(name, namespace))

    def wait(
        self,
        name: str,
        namespace: str | None = None,
        timeout: float | None = None,
        poll: float = 2.0,
        until: Callable[[Workload], bool] | None = None,
    ) -> Workload:
        """Block until the workload is finished, cancelled or preempted for
        good, or until ``until`` holds for it; WatchTimeout after ``timeout``
        seconds. Watches its events and re-reads it on each one, and at least
        every ``poll`` seconds."""
        ns = self.ops._required_ns(namespace)
        deadline = None if timeout is None else time.monotonic() + timeout
        position = self.head()
        while True:
            workload = cast(Workload, self.get("Workload", name, ns))
            if until(workload) if until else outcome(workload) is not None:
                return workload
            left = poll if deadline is None else min(poll, deadline - time.monotonic())
            if left <= 0:
                raise WatchTimeout(f"workload {ns}/{name} is still {workload.status.state}")
            for event in self.watch(position, namespace=ns, workload=name, timeout=left):
                position = event.position
                break

    # -- events ------------------------------------------------------------------------

    def head(self) -> int:
        """The position of the latest event."""
        return self.call(self.ops.head())

    def events(
        self,
        after: int = 0,
        *,
        namespace: str | None = None,
        workload: str | None = None,
        kind: str | None = None,
        type: str | None = None,
        page_size: int = 500,
    ) -> Iterator[Event]:
        """Every event after ``after`` that exists now, page after page."""
        filters = event_filters(namespace, workload, kind, type)
        while True:
            items, after = self.call(self.ops.events_page(after, page_size, filters))
            yield from items
            if len(items) < page_size:
                return

    def watch(
        self,
        after: int | None = None,
        *,
        namespace: str | None = None,
        workload: str | None = None,
        kind: str | None = None,
        type: str | None = None,
        timeout: float | None = None,
        server_timeout: float = 300.0,
    ) -> Iterator[Event]:
        """Events as they happen (server-sent events), from ``after`` (default:
        now). When the stream ends or drops, it reconnects with
        ``Last-Event-ID``: nothing is missed and nothing repeated. Ends after
        ``timeout`` seconds, or never."""
        position = self.head() if after is None else after
        filters = event_filters(namespace, workload, kind, type)
        deadline = None if timeout is None else time.monotonic() + timeout
        failures = 0
        while deadline is None or time.monotonic() < deadline:
            window = server_timeout
            if deadline is not None:
                window = max(0.05, min(window, deadline - time.monotonic()))
            decoder = SSEDecoder()
            try:
                for event in self._stream(position, filters, window, decoder):
                    failures = 0
                    position = event.position
                    yield event
            except (httpx.TransportError, TransportError) as error:
                failures += 1
                if failures >= self.retry.attempts:
                    raise TransportError(f"the event stream keeps failing: {error}") from error
                time.sleep(max(decoder.retry or 0.0, self.retry.delay(failures - 1)))

    def _stream(
        self, position: int, filters: Mapping[str, str | None], window: float, decoder: SSEDecoder
    ) -> Iterator[Event]:
        request = self._http.build_request(
            "GET",
            "/v1/events",
            params={**watch_params(filters, window), "after": position},
            headers={"Accept": "text/event-stream", "Last-Event-ID": str(position)},
            timeout=httpx.Timeout(self._http.timeout.connect, read=WATCH_READ_TIMEOUT),
        )
        response = self.send(request, stream=True)
        try:
            if response.status_code != 200:
                response.read()
                raise error_for(response)
            for line in response.iter_lines():
                decoded = decoder.feed(line)
                if decoded is not None:
                    yield Event.model_validate(json.loads(decoded[2]))
        finally:
            response.close()

    # -- ledger (auditors) -------------------------------------------------------------

    def ledger_entries(
        self, after: int | None = None, page_size: int = 500, **filters: Any
    ) -> Iterator[LedgerEntry]:
        """Ledger entries, oldest first, page after page. Filters: namespace,
        local_queue, cluster_queue, cluster, workload, actor, flavor, kind
        (a list), since, until."""
        while True:
            items, after = self.call(self.ops.ledger_page(filters, after, page_size))
            yield from items
            if after is None or not items:
                return

    def ledger_export(
        self, format: str = "ndjson", filtered: bool = False, **filters: Any
    ) -> Iterator[bytes]:
        """The ledger as NDJSON (what ``quartermaster ledger verify`` checks
        offline) or CSV, streamed; with ``filtered`` only the matching entries."""
        params = {**_http.ledger_params(filters), "format": format, "filtered": filtered}
        request = self._http.build_request("GET", "/v1/ledger/export", params=params)
        response = self.send(request, stream=True)
        try:
            if response.status_code != 200:
                response.read()
                raise error_for(response)
            yield from response.iter_bytes()
        finally:
            response.close()

    def usage(
        self,
        granularity: str = "day",
        by: Sequence[str] = ("namespace",),
        as_of: str | None = None,
    ) -> builtins.list[UsageRow]:
        """GPU-, CPU- and memory-hours per period and group, from the ledger."""
        return self.call(self.ops.usage(granularity, by, as_of))

    def latest_checkpoint(self) -> str:
        """The latest signed checkpoint (a C2SP tlog-checkpoint note)."""
        return self.call(self.ops.latest_checkpoint())

    def publish_checkpoint(self) -> str:
        return self.call(self.ops.publish_checkpoint())

    def inclusion_proof(self, seq: int, size: int | None = None) -> dict[str, Any]:
        return self.call(self.ops.inclusion_proof(seq, size))

    def consistency_proof(self, old: int, new: int | None = None) -> dict[str, Any]:
        return self.call(self.ops.consistency_proof(old, new))

    # -- identity ----------------------------------------------------------------------

    def whoami(self) -> WhoAmI:
        return self.call(self.ops.whoami())

    def issue_token(
        self,
        name: str,
        role: str,
        namespaces: builtins.list[str] | None = None,
        expires_in_seconds: int | None = None,
    ) -> IssuedToken:
        """A bearer token for a role (admins only); its secret is shown once.
        It expires after ``expires_in_seconds`` (the server's default: 90 days)."""
        return self.call(self.ops.issue_token(name, role, namespaces, expires_in_seconds))


__all__ = ["Client", "Resources"]
