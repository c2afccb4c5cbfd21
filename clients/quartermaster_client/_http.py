"""What the sync and async clients share: each API operation as a ``Call``
(the request and how to read its answer), the retry policy, and the
server-sent events decoder. The clients only send calls."""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from quartermaster_client.errors import error_for, retry_after
from quartermaster_client.kinds import Kind, resolve
from quartermaster_client.models import (
    BulkResult,
    Event,
    Explanation,
    IssuedToken,
    LedgerEntry,
    Page,
    Resource,
    UsageRow,
    WhoAmI,
    Workload,
)

T = TypeVar("T")
KindLike = str | Kind | type[Resource]
ObjectLike = Resource | Mapping[str, Any]
IDEMPOTENCY_HEADER = "Idempotency-Key"
USER_AGENT = "quartermaster-client/0.1"


@dataclass
class Call(Generic[T]):
    method: str
    path: str
    decode: Callable[[httpx.Response], T]
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    ok: tuple[int, ...] = (200, 201, 204)

    def request(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        params = {k: v for k, v in self.params.items() if v is not None}
        return client.build_request(
            self.method, self.path, params=params, json=self.json, headers=self.headers
        )

    def result(self, response: httpx.Response) -> T:
        if response.status_code not in self.ok:
            raise error_for(response)
        return self.decode(response)


# -- retries -----------------------------------------------------------------------------

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "PATCH"})
RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """Up to ``attempts`` tries; waits ``Retry-After`` when the server says
    so, else an exponential backoff with full jitter (AWS architecture blog,
    "Exponential Backoff And Jitter")."""

    attempts: int = 5
    backoff: float = 0.2
    max_backoff: float = 10.0
    max_retry_after: float = 60.0

    def delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        if response is not None:
            hinted = retry_after(response.headers)
            if hinted is not None:
                return min(hinted, self.max_retry_after)
        ceiling = min(self.max_backoff, self.backoff * (2**attempt))
        return random.uniform(ceiling / 2, ceiling)

    def retry_response(self, request: httpx.Request, response: httpx.Response) -> bool:
        if response.status_code in RETRY_STATUSES:
            return True
        # The first request with our key is still running on the server (a
        # retry after a lost answer): wait, then get its stored answer. Any
        # other conflict (already exists, stale version) is final.
        if response.status_code != 409 or IDEMPOTENCY_HEADER.lower() not in request.headers:
            return False
        response.read()
        try:
            problem = response.json()
        except ValueError:
            return False
        return isinstance(problem, dict) and str(problem.get("type", "")).endswith(
            "/idempotency-key-in-flight"
        )

    def retry_error(self, request: httpx.Request, error: httpx.TransportError) -> bool:
        if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
            return True  # nothing reached the server
        return request.method in IDEMPOTENT_METHODS or IDEMPOTENCY_HEADER.lower() in (
            request.headers
        )


NO_RETRIES = RetryPolicy(attempts=1)


def with_idempotency_key(request: httpx.Request) -> httpx.Request:
    """POSTs get a key unless the caller gave one; the same request object
    (and so the same key) is sent on every retry."""
    if request.method == "POST" and IDEMPOTENCY_HEADER.lower() not in request.headers:
        request.headers[IDEMPOTENCY_HEADER] = str(uuid.uuid4())
    return request


def base_headers(token: str | None) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


# -- objects -----------------------------------------------------------------------------


def to_body(obj: ObjectLike) -> dict[str, Any]:
    return obj.to_dict() if isinstance(obj, Resource) else dict(obj)


def _namespace(kind: Kind, body: Mapping[str, Any], namespace: str | None) -> str | None:
    if not kind.namespaced:
        return None
    found = namespace or (body.get("metadata") or {}).get("namespace")
    if not found:
        raise ValueError(f"{kind.kind} is namespaced: give a namespace")
    return str(found)


def _kind_of(body: Mapping[str, Any], kind: KindLike | None) -> Kind:
    if kind is not None:
        return resolve(kind)
    if not body.get("kind"):
        raise ValueError("the object has no kind; pass kind=")
    return resolve(str(body["kind"]))


def _object(kind: Kind) -> Callable[[httpx.Response], Resource]:
    def decode(response: httpx.Response) -> Resource:
        obj = kind.model.model_validate(response.json())
        obj._warnings = server_warnings(response)
        return obj

    return decode


_WARNING = re.compile(r'^\s*\d{3}\s+\S+\s+"((?:[^"\\]|\\.)*)"')


def server_warnings(response: httpx.Response) -> list[str]:
    """The texts of a response's ``Warning`` headers (RFC 7234: ``299 - "text"``),
    as Kubernetes sends them and ``kubectl`` prints them."""
    found = []
    for value in response.headers.get_list("warning"):
        match = _WARNING.match(value)
        if match:
            found.append(re.sub(r"\\(.)", r"\1", match.group(1)))
    return found


def _page(kind: Kind) -> Callable[[httpx.Response], Page[Resource]]:
    def decode(response: httpx.Response) -> Page[Resource]:
        body = response.json()
        metadata = body.get("metadata") or {}
        return Page(
            [kind.model.model_validate(item) for item in body.get("items", [])],
            metadata.get("continue") or None,
            str(metadata.get("resourceVersion", "")),
            str(body.get("kind", "")),
        )

    return decode


def _if_match(version: str | None) -> dict[str, str]:
    return {"If-Match": f'"{version}"'} if version else {}


class Operations:
    """Every API operation as a Call; namespaces default to ``namespace``."""

    def __init__(self, namespace: str | None = None) -> None:
        self.namespace = namespace

    def _ns(self, namespace: str | None) -> str | None:
        return namespace or self.namespace

    def _required_ns(self, namespace: str | None) -> str:
        found = self._ns(namespace)
        if not found:
            raise ValueError("give a namespace (or set one on the client or its context)")
        return found

    # -- every kind --------------------------------------------------------------------

    def get(self, kind: KindLike, name: str, namespace: str | None) -> Call[Resource]:
        k = resolve(kind)
        ns = self._required_ns(namespace) if k.namespaced else None
        return Call("GET", k.path(ns, name), _object(k))

    def list_page(
        self,
        kind: KindLike,
        namespace: str | None,
        all_namespaces: bool,
        label_selector: str | None,
        field_selector: str | None,
        limit: int | None,
        continue_token: str | None,
    ) -> Call[Page[Resource]]:
        k = resolve(kind)
        ns = None if all_namespaces or not k.namespaced else self._required_ns(namespace)
        params = {
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "limit": limit,
            "continue": continue_token,
        }
        return Call("GET", k.path(ns), _page(k), params=params)

    def create(
        self, obj: ObjectLike, namespace: str | None, kind: KindLike | None = None
    ) -> Call[Resource]:
        body = to_body(obj)
        k = _kind_of(body, kind)
        ns = _namespace(k, body, self._ns(namespace))
        return Call("POST", k.path(ns), _object(k), json=body)

    def replace(
        self,
        obj: ObjectLike,
        namespace: str | None,
        if_match: str | None,
        kind: KindLike | None = None,
    ) -> Call[Resource]:
        body = to_body(obj)
        k = _kind_of(body, kind)
        ns = _namespace(k, body, self._ns(namespace))
        name = str((body.get("metadata") or {}).get("name", ""))
        return Call("PUT", k.path(ns, name), _object(k), json=body, headers=_if_match(if_match))

    def patch(
        self,
        kind: KindLike,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None,
        if_match: str | None,
    ) -> Call[Resource]:
        k = resolve(kind)
        ns = self._required_ns(namespace) if k.namespaced else None
        headers = {"Content-Type": "application/merge-patch+json", **_if_match(if_match)}
        return Call("PATCH", k.path(ns, name), _object(k), json=dict(patch), headers=headers)

    def delete(
        self, kind: KindLike, name: str, namespace: str | None, if_match: str | None
    ) -> Call[Resource]:
        k = resolve(kind)
        ns = self._required_ns(namespace) if k.namespaced else None
        return Call("DELETE", k.path(ns, name), _object(k), headers=_if_match(if_match))

    # -- workloads ---------------------------------------------------------------------

    def submit(self, manifest: ObjectLike, namespace: str | None) -> Call[Workload]:
        body = to_body(manifest)
        ns = self._ns(namespace) or (body.get("metadata") or {}).get("namespace")
        if not ns:
            raise ValueError("give a namespace (or set metadata.namespace)")
        return Call(
            "POST",
            f"/v1/namespaces/{ns}/workloads",
            lambda r: Workload.model_validate(r.json()),
            json=body,
        )

    def bulk_submit(self, items: list[ObjectLike], namespace: str | None) -> Call[BulkResult]:
        ns = self._required_ns(namespace)
        return Call(
            "POST",
            f"/v1/namespaces/{ns}/bulk/workloads",
            lambda r: BulkResult.model_validate(r.json()),
            json={"items": [to_body(item) for item in items]},
            ok=(200, 207),
        )

    def cancel(self, name: str, namespace: str | None) -> Call[Workload]:
        ns = self._required_ns(namespace)
        return Call(
            "POST",
            f"/v1/namespaces/{ns}/workloads/{name}/cancel",
            lambda r: Workload.model_validate(r.json()),
        )

    def scale(self, name: str, replicas: int, namespace: str | None) -> Call[dict[str, Any]]:
        ns = self._required_ns(namespace)
        return Call(
            "PATCH",
            f"/v1/namespaces/{ns}/workloads/{name}/scale",
            lambda r: dict(r.json()),
            json={"spec": {"replicas": replicas}},
        )

    def explain(self, name: str, namespace: str | None) -> Call[Explanation]:
        ns = self._required_ns(namespace)
        return Call(
            "GET",
            f"/v1/namespaces/{ns}/workloads/{name}/explain",
            lambda r: Explanation.model_validate(r.json()),
        )

    # -- events, identity --------------------------------------------------------------

    def events_page(
        self, after: int, limit: int, filters: Mapping[str, str | None]
    ) -> Call[tuple[list[Event], int]]:
        def decode(response: httpx.Response) -> tuple[list[Event], int]:
            body = response.json()
            return [Event.model_validate(e) for e in body["items"]], int(body["next"])

        return Call("GET", "/v1/events", decode, params={"after": after, "limit": limit, **filters})

    def head(self) -> Call[int]:
        """The current event position: every list answer carries it as its
        ``resourceVersion`` (the API has no separate endpoint for it)."""
        return Call(
            "GET",
            "/v1/resourceflavors",
            lambda r: int(r.json()["metadata"]["resourceVersion"] or 0),
            params={"limit": 1},
        )

    # -- ledger --------------------------------------------------------------------------

    def ledger_page(
        self, filters: Mapping[str, Any], after: int | None, limit: int
    ) -> Call[tuple[list[LedgerEntry], int | None]]:
        def decode(response: httpx.Response) -> tuple[list[LedgerEntry], int | None]:
            body = response.json()
            items = [LedgerEntry.model_validate(e) for e in body.get("items", [])]
            return items, body.get("next")

        params = {**ledger_params(filters), "after": after, "limit": limit}
        return Call("GET", "/v1/ledger/entries", decode, params=params)

    def usage(self, granularity: str, by: Sequence[str], as_of: str | None) -> Call[list[UsageRow]]:
        return Call(
            "GET",
            "/v1/usage",
            lambda r: [UsageRow.model_validate(row) for row in r.json()["items"]],
            params={"granularity": granularity, "by": list(by), "asOf": as_of},
        )

    def latest_checkpoint(self) -> Call[str]:
        return Call("GET", "/v1/ledger/checkpoints/latest", lambda r: r.text)

    def publish_checkpoint(self) -> Call[str]:
        return Call("POST", "/v1/ledger/checkpoints", lambda r: r.text)

    def inclusion_proof(self, seq: int, size: int | None) -> Call[dict[str, Any]]:
        return Call(
            "GET",
            "/v1/ledger/proofs/inclusion",
            lambda r: dict(r.json()),
            params={"seq": seq, "size": size},
        )

    def consistency_proof(self, old: int, new: int | None) -> Call[dict[str, Any]]:
        return Call(
            "GET",
            "/v1/ledger/proofs/consistency",
            lambda r: dict(r.json()),
            params={"from": old, "to": new},
        )

    def whoami(self) -> Call[WhoAmI]:
        return Call("GET", "/v1/whoami", lambda r: WhoAmI.model_validate(r.json()))

    def issue_token(
        self,
        name: str,
        role: str,
        namespaces: list[str] | None,
        expires_in_seconds: int | None = None,
    ) -> Call[IssuedToken]:
        body: dict[str, Any] = {"name": name, "role": role, "namespaces": namespaces or []}
        if expires_in_seconds is not None:
            body["expiresInSeconds"] = expires_in_seconds
        return Call("POST", "/v1/tokens", lambda r: IssuedToken.model_validate(r.json()), json=body)


#: Ledger filters: SDK keyword -> query parameter.
LEDGER_FILTERS = {
    "namespace": "namespace",
    "local_queue": "localQueue",
    "cluster_queue": "clusterQueue",
    "cluster": "cluster",
    "workload": "workload",
    "actor": "actor",
    "flavor": "flavor",
    "kind": "kind",
    "since": "since",
    "until": "until",
}


def ledger_params(filters: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(filters) - set(LEDGER_FILTERS))
    if unknown:
        raise ValueError(f"unknown ledger filters {unknown}; known: {sorted(LEDGER_FILTERS)}")
    params: dict[str, Any] = {}
    for key, value in filters.items():
        if value is None or value == []:
            continue
        params[LEDGER_FILTERS[key]] = value.isoformat() if hasattr(value, "isoformat") else value
    return params


def watch_params(
    filters: Mapping[str, str | None], server_timeout: float
) -> dict[str, str | float]:
    params: dict[str, str | float] = {k: v for k, v in filters.items() if v is not None}
    params["watch"] = "true"
    params["timeoutSeconds"] = server_timeout
    return params


def event_filters(
    namespace: str | None, workload: str | None, kind: str | None, type: str | None
) -> dict[str, str | None]:
    return {"namespace": namespace, "workload": workload, "kind": kind, "type": type}


# -- server-sent events ------------------------------------------------------------------


class SSEDecoder:
    """The text/event-stream format (WHATWG HTML, "Server-sent events"), one
    line at a time; ``last_id`` and ``retry`` survive across events."""

    def __init__(self) -> None:
        self.last_id: str | None = None
        self.retry: float | None = None
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> tuple[str | None, str, str] | None:
        """(id, event type, data) when ``line`` ends an event, else None."""
        if line == "":
            if not self._data:
                self._event = ""
                return None
            event = (self._id, self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None  # a comment: the server's heartbeat
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
            self.last_id = value
        elif name == "retry" and value.isdigit():
            self.retry = int(value) / 1000
        return None


__all__ = [
    "NO_RETRIES",
    "Call",
    "Operations",
    "RetryPolicy",
    "SSEDecoder",
    "base_headers",
    "with_idempotency_key",
]
