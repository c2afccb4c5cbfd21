"""The asynchronous client: the same operations as ``Client``, awaited.

```python
async with AsyncClient(url, token=token) as qm:
    await qm.submit(job, namespace="team-a")
    async for w in qm.workloads.list(namespace="team-a"):
        ...
    async for event in qm.watch(namespace="team-a"):
        ...
```
"""

from __future__ import annotations

import asyncio
import builtins
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
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
from quartermaster_client.client import WATCH_READ_TIMEOUT
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


class AsyncResources(Generic[R]):
    """CRUD for one kind, typed and awaited."""

    def __init__(self, client: AsyncClient, kind: Kind) -> None:
        self._client = client
        self.kind = kind

    async def get(self, name: str, namespace: str | None = None) -> R:
        return cast(R, await self._client.get(self.kind, name, namespace))

    def list(
        self,
        namespace: str | None = None,
        *,
        all_namespaces: bool = False,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> AsyncIterator[R]:
        return cast(
            AsyncIterator[R],
            self._client.list(
                self.kind,
                namespace,
                all_namespaces=all_namespaces,
                label_selector=label_selector,
                field_selector=field_selector,
                page_size=page_size,
            ),
        )

    async def create(self, obj: R | Mapping[str, Any], namespace: str | None = None) -> R:
        return cast(R, await self._client.create(obj, namespace, kind=self.kind))

    async def replace(
        self, obj: R | Mapping[str, Any], namespace: str | None = None, if_match: str | None = None
    ) -> R:
        return cast(R, await self._client.replace(obj, namespace, if_match, kind=self.kind))

    async def patch(
        self,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        if_match: str | None = None,
    ) -> R:
        return cast(R, await self._client.patch(self.kind, name, patch, namespace, if_match))

    async def delete(
        self, name: str, namespace: str | None = None, if_match: str | None = None
    ) -> R:
        return cast(R, await self._client.delete(self.kind, name, namespace, if_match))

    async def apply(self, obj: R | Mapping[str, Any], namespace: str | None = None) -> Applied:
        return await self._client.apply(obj, namespace, kind=self.kind)


class AsyncClient:
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
        transport: httpx.AsyncBaseTransport | None = None,
        verify: bool = True,
    ) -> None:
        if base_url is None or context is not None:
            found = resolve_connection(base_url, token, namespace, context, config_path)
            base_url, token, namespace = found.server, found.token, found.namespace
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.ops = Operations(namespace)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=base_headers(token),
            timeout=timeout,
            transport=transport,
            verify=verify,
        )
        self.resourceflavors: AsyncResources[ResourceFlavor] = AsyncResources(
            self, BY_KIND["ResourceFlavor"]
        )
        self.topologies: AsyncResources[Topology] = AsyncResources(self, BY_KIND["Topology"])
        self.cohorts: AsyncResources[Cohort] = AsyncResources(self, BY_KIND["Cohort"])
        self.clusterqueues: AsyncResources[ClusterQueue] = AsyncResources(
            self, BY_KIND["ClusterQueue"]
        )
        self.localqueues: AsyncResources[LocalQueue] = AsyncResources(self, BY_KIND["LocalQueue"])
        self.workloadpriorityclasses: AsyncResources[WorkloadPriorityClass] = AsyncResources(
            self, BY_KIND["WorkloadPriorityClass"]
        )
        self.clusters: AsyncResources[Cluster] = AsyncResources(self, BY_KIND["Cluster"])
        self.workloads: AsyncResources[Workload] = AsyncResources(self, BY_KIND["Workload"])

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- sending -----------------------------------------------------------------------

    async def send(self, request: httpx.Request, stream: bool = False) -> httpx.Response:
        request = with_idempotency_key(request)
        attempt = 0
        while True:
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as error:
                if attempt + 1 >= self.retry.attempts or not self.retry.retry_error(request, error):
                    raise TransportError(
                        f"{request.method} {request.url}: {type(error).__name__}: {error}"
                    ) from error
                await asyncio.sleep(self.retry.delay(attempt))
                attempt += 1
                continue
            if attempt + 1 < self.retry.attempts and self.retry.retry_response(request, response):
                await response.aread()
                await response.aclose()
                await asyncio.sleep(self.retry.delay(attempt, response))
                attempt += 1
                continue
            return response

    async def call(self, call: Call[T]) -> T:
        response = await self.send(call.request(self._http))
        return call.result(response)

    # -- every kind --------------------------------------------------------------------

    async def get(self, kind: KindLike, name: str, namespace: str | None = None) -> Resource:
        return await self.call(self.ops.get(kind, name, namespace))

    async def list_page(
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
        return await self.call(
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

    async def list(
        self,
        kind: KindLike,
        namespace: str | None = None,
        *,
        all_namespaces: bool = False,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> AsyncIterator[Resource]:
        token: str | None = None
        while True:
            page = await self.list_page(
                kind,
                namespace,
                all_namespaces=all_namespaces,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=page_size,
                continue_token=token,
            )
            for item in page.items:
                yield item
            token = page.continue_token
            if not token:
                return

    async def create(
        self, obj: ObjectLike, namespace: str | None = None, kind: KindLike | None = None
    ) -> Resource:
        return await self.call(self.ops.create(obj, namespace, kind))

    async def replace(
        self,
        obj: ObjectLike,
        namespace: str | None = None,
        if_match: str | None = None,
        kind: KindLike | None = None,
    ) -> Resource:
        return await self.call(self.ops.replace(obj, namespace, if_match, kind))

    async def patch(
        self,
        kind: KindLike,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        if_match: str | None = None,
    ) -> Resource:
        return await self.call(self.ops.patch(kind, name, patch, namespace, if_match))

    async def delete(
        self,
        kind: KindLike,
        name: str,
        namespace: str | None = None,
        if_match: str | None = None,
    ) -> Resource:
        return await self.call(self.ops.delete(kind, name, namespace, if_match))

    async def apply(
        self, obj: ObjectLike, namespace: str | None = None, kind: KindLike | None = None
    ) -> Applied:
        body, notes = kueue_to_quartermaster(_http.to_body(obj))
        if is_volcano_queue(body):
            flavors = [f.name async for f in self.list("ResourceFlavor")]
            body, notes = volcano_queue_to_cluster_queue(body, lambda: flavors)
        given = (str(body.get("apiVersion") or ""), str(body.get("kind", "")))
        k = resolve(kind) if kind is not None else of_manifest(*given)
        name = body["metadata"]["name"]
        ns = namespace or body["metadata"].get("namespace")
        if k.kind == "Workload":
            try:
                return Applied(await self.submit(body, namespace), "created", notes)
            except AlreadyExists:
                return Applied(await self.get(k, name, ns), "unchanged", notes)
        for _ in range(3):
            try:
                current = await self.get(k, name, ns)
            except NotFound:
                try:
                    return Applied(await self.create(body, namespace, kind=k), "created", notes)
                except AlreadyExists:
                    continue
            if not differs(body, current.to_dict()):
                return Applied(current, "unchanged", notes)
            try:
                replaced = await self.replace(body, namespace, current.resource_version, kind=k)
            except StaleVersion:
                continue
            return Applied(replaced, "configured", notes)
        raise StaleVersion(409, "stale-version", "Conflict", f"{name} kept changing", [])

    # -- workloads ---------------------------------------------------------------------

    async def submit(self, manifest: ObjectLike, namespace: str | None = None) -> Workload:
        return await self.call(self.ops.submit(manifest, namespace))

    async def bulk_submit(
        self, items: builtins.list[ObjectLike], namespace: str | None = None
    ) -> BulkResult:
        return await self.call(self.ops.bulk_submit(items, namespace))

    async def cancel(self, name: str, namespace: str | None = None) -> Workload:
        return await self.call(self.ops.cancel(name, namespace))

    async def scale(self, name: str, replicas: int, namespace: str | None = None) -> dict[str, Any]:
        return await self.call(self.ops.scale(name, replicas, namespace))

    async def explain(self, name: str, namespace: str | None = None) -> Explanation:
        return await self.call(self.ops.explain(name, namespace))

    async def wait(
        self,
        name: str,
        namespace: str | None = None,
        timeout: float | None = None,
        poll: float = 2.0,
        until: Callable[[Workload], bool] | None = None,
    ) -> Workload:
        ns = self.ops._required_ns(namespace)
        deadline = None if timeout is None else time.monotonic() + timeout
        position = await self.head()
        while True:
            workload = cast(Workload, await self.get("Workload", name, ns))
            if until(workload) if until else outcome(workload) is not None:
                return workload
            left = poll if deadline is None else min(poll, deadline - time.monotonic())
            if left <= 0:
                raise WatchTimeout(f"workload {ns}/{name} is still {workload.status.state}")
            events = self.watch(position, namespace=ns, workload=name, timeout=left)
            async for event in events:
                position = event.position
                break
            await events.aclose()

    # -- events ------------------------------------------------------------------------

    async def head(self) -> int:
        return await self.call(self.ops.head())

    async def events(
        self,
        after: int = 0,
        *,
        namespace: str | None = None,
        workload: str | None = None,
        kind: str | None = None,
        type: str | None = None,
        page_size: int = 500,
    ) -> AsyncIterator[Event]:
        filters = event_filters(namespace, workload, kind, type)
        while True:
            items, after = await self.call(self.ops.events_page(after, page_size, filters))
            for item in items:
                yield item
            if len(items) < page_size:
                return

    async def watch(
        self,
        after: int | None = None,
        *,
        namespace: str | None = None,
        workload: str | None = None,
        kind: str | None = None,
        type: str | None = None,
        timeout: float | None = None,
        server_timeout: float = 300.0,
    ) -> AsyncGenerator[Event, None]:
        """As ``Client.watch``: resumes with Last-Event-ID after a drop."""
        position = await self.head() if after is None else after
        filters = event_filters(namespace, workload, kind, type)
        deadline = None if timeout is None else time.monotonic() + timeout
        failures = 0
        while deadline is None or time.monotonic() < deadline:
            window = server_timeout
            if deadline is not None:
                window = max(0.05, min(window, deadline - time.monotonic()))
            decoder = SSEDecoder()
            request = self._http.build_request(
                "GET",
                "/v1/events",
                params={**watch_params(filters, window), "after": position},
                headers={"Accept": "text/event-stream", "Last-Event-ID": str(position)},
                timeout=httpx.Timeout(self._http.timeout.connect, read=WATCH_READ_TIMEOUT),
            )
            try:
                response = await self.send(request, stream=True)
                try:
                    if response.status_code != 200:
                        await response.aread()
                        raise error_for(response)
                    async for line in response.aiter_lines():
                        decoded = decoder.feed(line)
                        if decoded is None:
                            continue
                        event = Event.model_validate(json.loads(decoded[2]))
                        failures = 0
                        position = event.position
                        yield event
                finally:
                    await response.aclose()
            except (httpx.TransportError, TransportError) as error:
                failures += 1
                if failures >= self.retry.attempts:
                    raise TransportError(f"the event stream keeps failing: {error}") from error
                await asyncio.sleep(max(decoder.retry or 0.0, self.retry.delay(failures - 1)))

    # -- ledger (auditors) -------------------------------------------------------------

    async def ledger_entries(
        self, after: int | None = None, page_size: int = 500, **filters: Any
    ) -> AsyncIterator[LedgerEntry]:
        while True:
            items, after = await self.call(self.ops.ledger_page(filters, after, page_size))
            for item in items:
                yield item
            if after is None or not items:
                return

    async def ledger_export(
        self, format: str = "ndjson", filtered: bool = False, **filters: Any
    ) -> AsyncIterator[bytes]:
        params = {**_http.ledger_params(filters), "format": format, "filtered": filtered}
        request = self._http.build_request("GET", "/v1/ledger/export", params=params)
        response = await self.send(request, stream=True)
        try:
            if response.status_code != 200:
                await response.aread()
                raise error_for(response)
            async for chunk in response.aiter_bytes():
                yield chunk
        finally:
            await response.aclose()

    async def usage(
        self,
        granularity: str = "day",
        by: Sequence[str] = ("namespace",),
        as_of: str | None = None,
    ) -> builtins.list[UsageRow]:
        return await self.call(self.ops.usage(granularity, by, as_of))

    async def latest_checkpoint(self) -> str:
        return await self.call(self.ops.latest_checkpoint())

    async def inclusion_proof(self, seq: int, size: int | None = None) -> dict[str, Any]:
        return await self.call(self.ops.inclusion_proof(seq, size))

    async def consistency_proof(self, old: int, new: int | None = None) -> dict[str, Any]:
        return await self.call(self.ops.consistency_proof(old, new))

    async def whoami(self) -> WhoAmI:
        return await self.call(self.ops.whoami())


__all__ = ["AsyncClient", "AsyncResources"]
