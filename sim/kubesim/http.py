"""The HTTP face of a simulated cluster: a plain ASGI application.

No framework on purpose: the routes are the Kubernetes REST layout
(``/api/v1/namespaces/{ns}/{plural}/{name}/{subresource}``), requests are
small, and the stand-in must answer well over a thousand writes a second and
hold long watch streams, so a request costs one path split, one JSON parse and
one ``ApiCore`` call. Watches stream newline-delimited JSON events over chunked
transfer encoding, exactly like the real server.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson
import yaml

from service.runtime.jsonio import dumps, loads
from sim.kubesim import errors
from sim.kubesim.api import APPLY_PATCH, APPLY_PATCH_CBOR, Context, Resource
from sim.kubesim.auth import AuditRecord, User, forbidden_reason
from sim.kubesim.errors import ApiError, Cause
from sim.kubesim.selectors import parse_field_selector, parse_label_selector
from sim.kubesim.store import ADDED, DELETED, MODIFIED, Event, Watcher, clone
from sim.kubesim.tables import table

if TYPE_CHECKING:
    from sim.kubesim.cluster import SimCluster

__all__ = ["KubeApp"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON = b"application/json"
_OPEN_PATHS = ("/version", "/healthz", "/readyz", "/livez")


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("1", "true")


@dataclass(slots=True)
class Target:
    """What a resource URL names."""

    resource: Resource
    namespace: str
    name: str
    subresource: str


class KubeApp:
    """ASGI app for one :class:`~sim.kubesim.cluster.SimCluster`; ``admin`` serves ``/_admin``."""

    def __init__(self, cluster: SimCluster, *, admin_only: bool = False) -> None:
        self.cluster = cluster
        self.admin_only = admin_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request = await _read(scope, receive)
        try:
            if request.path.startswith("/_admin"):
                await self._admin(request, send)
            elif self.admin_only:
                raise errors.not_served()
            else:
                await self._serve(request, scope, receive, send)
        except ApiError as error:
            await _respond(send, error.code, dumps(error.body()), headers=error.headers)
        except Exception as error:  # a bug here must look like a 500, not a dropped connection
            self.cluster.log.exception("internal error serving %s %s", request.method, request.path)
            failure = ApiError(500, "InternalError", f"Internal error occurred: {error}")
            await _respond(send, 500, dumps(failure.body()))

    # -- dispatch --------------------------------------------------------------------------

    async def _serve(self, request: Request, scope: Scope, receive: Receive, send: Send) -> None:
        # The generated client asks for ``/version/`` and ``/apis/``; the real server serves both.
        path = request.path.rstrip("/") or "/"
        user = self.cluster.auth.authenticate(request.headers.get("authorization"))
        if path in _OPEN_PATHS:
            await self._open(path, send)
            return
        if user is None:
            raise errors.unauthorized()
        parts = [p for p in path.split("/") if p]
        if not parts:
            await _respond(
                send, 200, dumps({"paths": ["/api", "/apis", "/version", "/openapi/v3"]})
            )
            return
        if parts[0] == "openapi":
            await self._openapi(parts, send)
            return
        if parts[0] == "api":
            await self._api(parts[1:], "", request, user, scope, receive, send)
        elif parts[0] == "apis":
            if len(parts) == 1:
                await _respond(send, 200, dumps(self.cluster.discovery.group_list()))
            elif len(parts) == 2:
                group = self.cluster.discovery.group(parts[1])
                if group is None:
                    raise errors.not_served()
                await _respond(send, 200, dumps(group))
            else:
                await self._api(parts[2:], parts[1], request, user, scope, receive, send)
        else:
            raise errors.not_served()

    async def _open(self, path: str, send: Send) -> None:
        if path == "/version":
            await _respond(send, 200, dumps(self.cluster.discovery.version()))
        else:
            await _respond(send, 200, b"ok", content_type=b"text/plain; charset=utf-8")

    async def _openapi(self, parts: list[str], send: Send) -> None:
        discovery = self.cluster.discovery
        if parts[:2] != ["openapi", "v3"]:
            raise errors.not_served()
        if len(parts) == 2:
            await _respond(send, 200, dumps(discovery.openapi_index()))
            return
        rest = parts[2:]
        group, version = (
            ("", rest[1]) if rest[0] == "api" else (rest[1], rest[2] if len(rest) > 2 else "")
        )
        body = discovery.openapi(group, version)
        if body is None:
            raise errors.not_served()
        await _respond(send, 200, body)

    async def _api(
        self,
        parts: list[str],
        group: str,
        request: Request,
        user: User,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        discovery = self.cluster.discovery
        if not parts:
            if group:
                raise errors.not_served()
            await _respond(send, 200, dumps(discovery.core_versions(self.cluster.address)))
            return
        version, rest = parts[0], parts[1:]
        if not rest:
            body = discovery.resource_list(group, version)
            if body is None:
                raise errors.not_served()
            await _respond(send, 200, body)
            return
        target = self._target(group, version, rest)
        verb = _verb(request, target)
        await self.cluster.faults.before(verb, target.resource.plural)
        self._authorize(user, verb, target)
        code = 200
        try:
            code = await self._handle(verb, target, request, user, scope, receive, send)
        except ApiError as error:
            code = error.code
            raise
        finally:
            self.cluster.auth.record(
                AuditRecord(
                    user.name,
                    verb,
                    group,
                    target.resource.plural,
                    target.subresource,
                    target.namespace,
                    target.name,
                    code,
                )
            )

    def _target(self, group: str, version: str, rest: list[str]) -> Target:
        core = self.cluster.core
        namespace = ""
        if rest[0] == "namespaces" and len(rest) >= 3:
            candidate = core.find(group, version, rest[2])
            if candidate is not None and candidate.rtype.namespaced:
                namespace, rest = rest[1], rest[2:]
        resource = core.find(group, version, rest[0])
        if resource is None or len(rest) > 3:
            raise errors.not_served()
        name = rest[1] if len(rest) > 1 else ""
        subresource = rest[2] if len(rest) > 2 else ""
        if subresource and not (subresource == "status" and resource.rtype.has_status):
            raise errors.not_served()
        if resource.rtype.namespaced and name and not namespace:
            raise errors.not_served()
        return Target(resource, namespace, name, subresource)

    def _authorize(self, user: User, verb: str, target: Target) -> None:
        resource = target.resource
        auth = self.cluster.auth
        if auth.allows(
            user,
            verb,
            resource.group,
            resource.plural,
            target.subresource,
            target.namespace,
            target.name,
        ):
            return
        why = forbidden_reason(
            user, verb, resource.group, resource.plural, target.subresource, target.namespace
        )
        raise errors.forbidden(resource.plural, resource.group, target.name, why)

    async def _handle(
        self,
        verb: str,
        target: Target,
        request: Request,
        user: User,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> int:
        core = self.cluster.core
        resource, namespace, name = target.resource, target.namespace, target.name
        if verb == "watch":
            await self._watch(target, request, receive, send)
            return 200
        if verb == "list":
            await self._list(target, request, send)
            return 200
        if verb == "get":
            obj = core.get(resource, namespace, name)
            await self._object(send, 200, resource, obj, request)
            return 200
        ctx = _context(request, user)
        if verb == "create":
            body = _body_object(request)
            obj = core.create(resource, namespace, body, ctx, owned=True)
            code = 201
        elif verb == "update":
            obj = core.update(
                resource, namespace, name, _body_object(request), ctx, target.subresource
            )
            code = 200
        elif verb == "patch":
            content_type = _content_type(request)
            # An apply that creates its object answers 201, as the real server's.
            creates = (
                content_type in (APPLY_PATCH, APPLY_PATCH_CBOR)
                and not target.subresource
                and self.cluster.store.get(resource.rtype, namespace, name) is None
            )
            obj = core.patch(
                resource,
                namespace,
                name,
                content_type,
                _body(request, content_type),
                ctx,
                subresource=target.subresource,
                force=request.flag("force"),
                owned=True,
            )
            code = 201 if creates else 200
        elif verb == "delete":
            return await self._delete(target, request, ctx, send)
        elif verb == "deletecollection":
            return await self._delete_collection(target, request, ctx, send)
        else:
            raise errors.method_not_allowed()
        await self._object(send, code, resource, obj, request, ctx.warnings)
        return code

    async def _object(
        self,
        send: Send,
        code: int,
        resource: Resource,
        obj: dict[str, Any],
        request: Request,
        warnings: list[str] | None = None,
    ) -> None:
        """Answer with ``obj`` (as stored: shown at ``resource``'s version here)."""
        if _wants_table(request):
            shown = self.cluster.core.present(resource, obj)
            rv = shown["metadata"].get("resourceVersion", "")
            body = table(
                resource.rtype,
                resource.version.name,
                [shown],
                rv,
                request.query.get("includeObject", "Metadata"),
            )
            await _respond(send, code, dumps(body), warnings=warnings)
            return
        await _respond(send, code, self._json(resource, obj), warnings=warnings)

    def _json(self, resource: Resource, obj: dict[str, Any]) -> bytes:
        """``obj`` as served at ``resource``'s version (encoded once per stored object)."""
        text = self.cluster.store.encoded(resource.rtype, obj, resource.api_version)
        return text if text is not None else dumps(self.cluster.core.present(resource, obj))

    async def _list(self, target: Target, request: Request, send: Send) -> None:
        core = self.cluster.core
        resource = target.resource
        items, rv, token, remaining = core.list(
            resource,
            target.namespace,
            labels=parse_label_selector(request.query.get("labelSelector")),
            fields=parse_field_selector(request.query.get("fieldSelector"), _selectable(resource)),
            limit=int(request.query.get("limit") or 0),
            continue_token=request.query.get("continue", ""),
            resource_version=request.query.get("resourceVersion", ""),
            resource_version_match=request.query.get("resourceVersionMatch", ""),
        )
        if not _wants_table(request):
            parts = [
                self.cluster.store.encoded(resource.rtype, o, resource.api_version) for o in items
            ]
            if all(part is not None for part in parts):
                head = _list_head(resource, rv, token, remaining)
                await _respond(send, 200, _spliced(head, b"items", parts))
                return
        items = [core.present(resource, obj) for obj in items]
        if _wants_table(request):
            body = table(
                resource.rtype,
                resource.version.name,
                items,
                str(rv),
                request.query.get("includeObject", "Metadata"),
                continue_token=token,
            )
            await _respond(send, 200, dumps(body))
            return
        await _respond(
            send, 200, dumps({**_list_head(resource, rv, token, remaining), "items": items})
        )

    async def _delete(self, target: Target, request: Request, ctx: Context, send: Send) -> int:
        core = self.cluster.core
        options = _delete_options(request)
        obj, gone = core.delete(
            target.resource,
            target.namespace,
            target.name,
            ctx,
            propagation=options.get("propagationPolicy") or "",
            preconditions=options.get("preconditions"),
        )
        resource = target.resource
        if gone and not resource.rtype.builtin:
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {
                    "name": target.name,
                    "group": resource.group,
                    "kind": resource.plural,
                    "uid": obj["metadata"].get("uid", ""),
                },
            }
            await _respond(send, 200, dumps(status), warnings=ctx.warnings)
            return 200
        await _respond(send, 200, dumps(core.present(resource, obj)), warnings=ctx.warnings)
        return 200

    async def _delete_collection(
        self, target: Target, request: Request, ctx: Context, send: Send
    ) -> int:
        core = self.cluster.core
        options = _delete_options(request)
        items, _, _, _ = core.list(
            target.resource,
            target.namespace,
            labels=parse_label_selector(request.query.get("labelSelector")),
            fields=parse_field_selector(
                request.query.get("fieldSelector"), _selectable(target.resource)
            ),
        )
        deleted = []
        for obj in items:
            try:
                result, _ = core.delete(
                    target.resource,
                    obj["metadata"].get("namespace", ""),
                    obj["metadata"]["name"],
                    ctx,
                    propagation=options.get("propagationPolicy") or "",
                )
                deleted.append(core.present(target.resource, result))
            except ApiError as error:
                if error.code != 404:
                    raise
        body = {
            "kind": target.resource.rtype.list_kind,
            "apiVersion": target.resource.api_version,
            "metadata": {"resourceVersion": str(self.cluster.store.rv)},
            "items": deleted,
        }
        await _respond(send, 200, dumps(body))
        return 200

    # -- watch -----------------------------------------------------------------------------

    async def _watch(self, target: Target, request: Request, receive: Receive, send: Send) -> None:
        session = WatchSession(self.cluster, target, request)
        try:
            initial = session.open()
        except ApiError as error:
            # An expired resourceVersion is an ERROR event on a 200 stream, as from the watch cache.
            await _start_stream(send)
            line = dumps({"type": "ERROR", "object": error.body()}) + b"\n"
            await send({"type": "http.response.body", "body": line, "more_body": False})
            return
        await _start_stream(send)
        disconnected = asyncio.Event()
        listener = asyncio.ensure_future(_wait_disconnect(receive, disconnected, session.watcher))
        try:
            await session.stream(send, initial, disconnected)
        finally:
            listener.cancel()
            session.close()

    # -- admin -----------------------------------------------------------------------------

    async def _admin(self, request: Request, send: Send) -> None:
        user = self.cluster.auth.authenticate(request.headers.get("authorization"))
        if user is None:
            raise errors.unauthorized()
        if not user.admin:
            raise ApiError(403, "Forbidden", f'User "{user.name}" may not use the admin endpoints')
        body = loads(request.body) if request.body else {}
        result = await self.cluster.admin(
            request.method, request.path.split("/")[2:], body, request.query
        )
        await _respond(send, 200, dumps(result))


class WatchSession:
    """One watch request: initial state or history replay, then live events and bookmarks."""

    def __init__(self, cluster: SimCluster, target: Target, request: Request) -> None:
        self.cluster = cluster
        self.target = target
        self.resource = target.resource
        self.labels = parse_label_selector(request.query.get("labelSelector"))
        self.fields = parse_field_selector(
            request.query.get("fieldSelector"), _selectable(self.resource)
        )
        self.namespace = target.namespace
        self.name = self.fields.exact("metadata.name") or ""
        self.rv = request.query.get("resourceVersion", "")
        self.bookmarks = request.flag("allowWatchBookmarks")
        self.send_initial = request.flag("sendInitialEvents")
        self.table = _wants_table(request)
        self.include = request.query.get("includeObject", "Metadata")
        timeout = request.query.get("timeoutSeconds")
        self.deadline = time.monotonic() + (
            float(timeout) if timeout else cluster.options.max_watch_seconds
        )
        self.watcher = Watcher(self._in_scope)
        self.columns_sent = False
        self.last_rv = 0

    def _in_scope(self, event: Event) -> bool:
        key = event.key
        return (not self.namespace or key[0] == self.namespace) and (
            not self.name or key[1] == self.name
        )

    def _matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        return self.cluster.core._matches(self.resource.rtype, obj, self.labels, self.fields)

    def open(self) -> list[tuple[str, dict[str, Any]]]:
        """Register the watcher and collect what precedes live events, atomically."""
        store = self.cluster.store
        collection = store.collection(self.resource.rtype)
        initial: list[tuple[str, dict[str, Any]]] = []
        if self.rv in ("", "0") or self.send_initial:
            for obj in store.items(self.resource.rtype, self.namespace):
                if (not self.name or obj["metadata"]["name"] == self.name) and self._matches(obj):
                    initial.append((ADDED, obj))
            self.last_rv = store.rv
        else:
            replay = collection.events_after(int(self.rv))
            for event in replay:
                if self._in_scope(event):
                    translated = self._translate(event)
                    if translated:
                        initial.append(translated)
            self.last_rv = int(self.rv)
        collection.watchers.add(self.watcher)
        self.cluster.watchers.add(self.watcher)
        return initial

    def close(self) -> None:
        self.cluster.store.collection(self.resource.rtype).watchers.discard(self.watcher)
        self.cluster.watchers.discard(self.watcher)

    def _translate(self, event: Event) -> tuple[str, dict[str, Any]] | None:
        now, before = self._matches(event.obj), self._matches(event.prev)
        if event.type == DELETED:
            return (DELETED, event.obj) if before or now else None
        if now and before:
            return MODIFIED, event.obj
        if now:
            return ADDED, event.obj
        if before and event.type == MODIFIED:
            return DELETED, event.obj
        return None

    def _encode(self, kind: str, obj: dict[str, Any]) -> bytes:
        if not self.table:
            text = self.cluster.store.encoded(self.resource.rtype, obj, self.resource.api_version)
            if text is not None:
                # ``kind`` is ADDED, MODIFIED or DELETED: nothing in it to escape.
                return b'{"type":"' + kind.encode() + b'","object":' + text + b"}\n"
        shown = self.cluster.core.present(self.resource, obj)
        if self.table:
            shown = table(
                self.resource.rtype,
                self.resource.version.name,
                [shown],
                shown["metadata"].get("resourceVersion", ""),
                self.include,
                with_columns=not self.columns_sent,
            )
            self.columns_sent = True
        return dumps({"type": kind, "object": shown}) + b"\n"

    def _bookmark(self, initial_end: bool = False) -> bytes:
        metadata: dict[str, Any] = {"resourceVersion": str(self.last_rv)}
        if initial_end:
            metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {
            "kind": self.resource.rtype.kind,
            "apiVersion": self.resource.api_version,
            "metadata": metadata,
        }
        return dumps({"type": "BOOKMARK", "object": obj}) + b"\n"

    async def stream(
        self, send: Send, initial: list[tuple[str, dict[str, Any]]], disconnected: asyncio.Event
    ) -> None:
        chunk = b"".join(self._encode(kind, obj) for kind, obj in initial)
        if self.send_initial and self.bookmarks:
            chunk += self._bookmark(initial_end=True)
        if chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        interval = self.cluster.options.bookmark_interval
        while not disconnected.is_set() and not self.watcher.closed:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                break
            batch = await self.watcher.next_batch(min(interval, remaining))
            if disconnected.is_set():
                break
            lines = []
            for event in batch:
                translated = self._translate(event)
                self.last_rv = event.rv
                if translated:
                    lines.append(self._encode(*translated))
            if not batch and self.bookmarks and not self.watcher.closed:
                self.last_rv = self.cluster.store.rv
                lines.append(self._bookmark())
            if lines:
                await send(
                    {"type": "http.response.body", "body": b"".join(lines), "more_body": True}
                )
        if not disconnected.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _wait_disconnect(receive: Receive, disconnected: asyncio.Event, watcher: Watcher) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnected.set()
            watcher.ready.set()
            return


# -- request / response helpers ------------------------------------------------------------


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read(scope: Scope, receive: Receive) -> Request:
    chunks = []
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    query = dict(_query(scope["query_string"]))
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    return Request(scope["method"], scope["path"], query, headers, b"".join(chunks))


@functools.lru_cache(maxsize=1024)
def _query(raw: bytes) -> dict[str, str]:
    """A query string's parameters (the last of repeated ones); remembered, as clients send
    the same few again and again: callers take a copy."""
    return {k: v[-1] for k, v in parse_qs(raw.decode(), keep_blank_values=True).items()}


def _audit_id() -> bytes:
    """A random (version 4) UUID, as ``uuid.uuid4`` makes it, without its object."""
    h = os.urandom(16).hex()
    variant = "89ab"[int(h[16], 16) & 3]
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:]}".encode()


async def _start_stream(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", _JSON), (b"cache-control", b"no-cache, private")],
        }
    )


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    *,
    content_type: bytes = _JSON,
    headers: dict[str, str] | None = None,
    warnings: list[str] | None = None,
) -> None:
    raw = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"audit-id", _audit_id()),
        (b"cache-control", b"no-cache, private"),
    ]
    for key, value in (headers or {}).items():
        raw.append((key.lower().encode(), value.encode()))
    for warning in dict.fromkeys(warnings or ()):
        raw.append((b"warning", f'299 - "{warning}"'.encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _list_head(resource: Resource, rv: int, token: str, remaining: int | None) -> dict[str, Any]:
    """A list's kind, apiVersion and metadata (its items follow)."""
    metadata: dict[str, Any] = {"resourceVersion": str(rv)}
    if token:
        metadata["continue"] = token
    if remaining is not None:
        metadata["remainingItemCount"] = remaining
    return {
        "kind": resource.rtype.list_kind,
        "apiVersion": resource.api_version,
        "metadata": metadata,
    }


def _spliced(head: dict[str, Any], name: bytes, parts: list[bytes | None]) -> bytes:
    """``head`` with a last member ``name`` whose value is the array of the JSON ``parts``:
    the bytes orjson writes for the whole (compact, members in order)."""
    opening = orjson.dumps(head)[:-1]
    separator = b"," if len(head) else b""
    items = b",".join(part for part in parts if part is not None)
    return opening + separator + b'"' + name + b'":[' + items + b"]}"


def _verb(request: Request, target: Target) -> str:
    method = request.method
    if method == "GET":
        if target.name:
            return "get"
        return "watch" if request.flag("watch") else "list"
    if method == "POST" and not target.name:
        return "create"
    if method == "PUT" and target.name:
        return "update"
    if method == "PATCH" and target.name:
        return "patch"
    if method == "DELETE":
        return "delete" if target.name else "deletecollection"
    raise errors.method_not_allowed(
        f"the server does not allow this method on the requested resource ({method})"
    )


def _wants_table(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "as=Table" in accept and "g=meta.k8s.io" in accept


def _selectable(resource: Resource) -> tuple[str, ...]:
    return ("metadata.name", "metadata.namespace", *resource.rtype.field_selectors)


def _parse(raw: bytes, content_type: str) -> Any:
    if not raw:
        raise errors.bad_request("the request body is empty")
    try:
        if "yaml" in content_type:
            # Clients mostly send JSON, which is YAML too; the JSON parser is 50x faster.
            if raw.lstrip()[:1] in (b"{", b"["):
                try:
                    return loads(raw)
                except ValueError:
                    pass
            # Copied: YAML anchors make one node appear in several places, and a body
            # is stored as it is (ApiCore's ``owned``): no part of it may alias another.
            return clone(yaml.load(raw, Loader=yaml.CSafeLoader))
        return loads(raw)
    except (ValueError, yaml.YAMLError) as error:
        raise errors.bad_request(f"the body of the request could not be decoded: {error}") from None


def _body(request: Request, content_type: str) -> Any:
    if content_type == APPLY_PATCH:
        return _parse(request.body, "yaml")
    return _parse(request.body, content_type)


def _body_object(request: Request) -> dict[str, Any]:
    body = _parse(request.body, request.headers.get("content-type", "application/json"))
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON object")
    return body


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip()


def _context(request: Request, user: User) -> Context:
    manager = request.query.get("fieldManager", "")
    if not manager:
        if request.method == "PATCH" and _content_type(request) in (APPLY_PATCH, APPLY_PATCH_CBOR):
            # ValidatePatchOptions: controllers must name themselves for apply.
            raise errors.invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                [
                    Cause(
                        "FieldValueRequired",
                        "Required value: is required for apply patch",
                        "fieldManager",
                    )
                ],
            )
        manager = request.headers.get("user-agent", "unknown").split("/")[0][:128]
    dry_run = request.query.get("dryRun", "")
    if dry_run and dry_run != "All":
        raise errors.bad_request(f'dryRun: Unsupported value: "{dry_run}": supported values: "All"')
    validation = request.query.get("fieldValidation", "")
    if validation and validation not in ("Strict", "Warn", "Ignore"):
        raise errors.bad_request(
            f'fieldValidation: Unsupported value: "{validation}": '
            'supported values: "Ignore", "Strict", "Warn"'
        )
    return Context(
        user=user.name, manager=manager, dry_run=dry_run == "All", field_validation=validation
    )


def _delete_options(request: Request) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if request.body:
        try:
            parsed = loads(request.body)
        except ValueError:
            raise errors.bad_request("the body of the request could not be decoded") from None
        if isinstance(parsed, dict):
            options = parsed
    if request.query.get("propagationPolicy"):
        options["propagationPolicy"] = request.query["propagationPolicy"]
    orphan = options.get("orphanDependents", request.query.get("orphanDependents"))
    if orphan in (True, "true") and not options.get("propagationPolicy"):
        options["propagationPolicy"] = "Orphan"
    policy = options.get("propagationPolicy")
    if policy and policy not in ("Orphan", "Background", "Foreground"):
        raise errors.bad_request(f'propagationPolicy: Unsupported value: "{policy}"')
    return options
