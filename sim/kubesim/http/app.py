"""The ASGI application: routes the Kubernetes REST layout to discovery, OpenAPI, the
admin endpoints and the verbs of :class:`~sim.kubesim.api.ApiCore`, and maps every
:class:`~sim.kubesim.errors.ApiError` to its ``Status`` answer in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.jsonio import dumps, loads
from sim.kubesim import errors
from sim.kubesim.api import APPLY_PATCH, APPLY_PATCH_CBOR, Context, Resource
from sim.kubesim.api.scale import patch_scale, read_scale, update_scale
from sim.kubesim.auth import AuditRecord, User, forbidden_reason
from sim.kubesim.errors import ApiError
from sim.kubesim.http.request import (
    Receive,
    Request,
    Scope,
    Send,
    Target,
    body_object,
    body_of,
    content_type_of,
    delete_options,
    read_request,
    selectable_fields,
    verb_of,
    wants_table,
    write_context,
)
from sim.kubesim.http.response import list_head, respond, spliced
from sim.kubesim.http.watch import serve_watch
from sim.kubesim.selectors import parse_field_selector, parse_label_selector
from sim.kubesim.tables import table

if TYPE_CHECKING:
    from sim.kubesim.cluster import SimCluster

__all__ = ["KubeApp"]

_OPEN_PATHS = ("/version", "/healthz", "/readyz", "/livez")


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
        request = await read_request(scope, receive)
        try:
            if request.path.startswith("/_admin"):
                await self._admin(request, send)
            elif self.admin_only:
                raise errors.not_served()
            else:
                await self._serve(request, scope, receive, send)
        except ApiError as error:
            await respond(send, error.code, dumps(error.body()), headers=error.headers)
        except Exception as error:  # a bug here must look like a 500, not a dropped connection
            self.cluster.log.exception("internal error serving %s %s", request.method, request.path)
            failure = ApiError(500, "InternalError", f"Internal error occurred: {error}")
            await respond(send, 500, dumps(failure.body()))

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
            await respond(send, 200, dumps({"paths": ["/api", "/apis", "/version", "/openapi/v3"]}))
            return
        if parts[0] == "openapi":
            await self._openapi(parts, send)
            return
        if parts[0] == "api":
            await self._api(parts[1:], "", request, user, scope, receive, send)
        elif parts[0] == "apis":
            if len(parts) == 1:
                await respond(send, 200, dumps(self.cluster.discovery.group_list()))
            elif len(parts) == 2:
                group = self.cluster.discovery.group(parts[1])
                if group is None:
                    raise errors.not_served()
                await respond(send, 200, dumps(group))
            else:
                await self._api(parts[2:], parts[1], request, user, scope, receive, send)
        else:
            raise errors.not_served()

    async def _open(self, path: str, send: Send) -> None:
        if path == "/version":
            await respond(send, 200, dumps(self.cluster.discovery.version()))
        else:
            await respond(send, 200, b"ok", content_type=b"text/plain; charset=utf-8")

    async def _openapi(self, parts: list[str], send: Send) -> None:
        discovery = self.cluster.discovery
        if parts[:2] != ["openapi", "v3"]:
            raise errors.not_served()
        if len(parts) == 2:
            await respond(send, 200, dumps(discovery.openapi_index()))
            return
        rest = parts[2:]
        group, version = (
            ("", rest[1]) if rest[0] == "api" else (rest[1], rest[2] if len(rest) > 2 else "")
        )
        body = discovery.openapi(group, version)
        if body is None:
            raise errors.not_served()
        await respond(send, 200, body)

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
            await respond(send, 200, dumps(discovery.core_versions(self.cluster.address)))
            return
        version, rest = parts[0], parts[1:]
        if not rest:
            body = discovery.resource_list(group, version)
            if body is None:
                raise errors.not_served()
            await respond(send, 200, body)
            return
        target = self._target(group, version, rest)
        verb = verb_of(request, target)
        await self.cluster.faults.before(verb, target.resource.plural)
        code, allowed = 200, False
        try:  # a refusal is audited too
            self._authorize(user, verb, target)
            allowed = True
            code = await self._handle(verb, target, request, user, scope, receive, send)
        except ApiError as error:
            code = error.code
            raise
        finally:
            self._audit(user, verb, target, code, allowed)

    def _audit(self, user: User, verb: str, target: Target, code: int, allowed: bool) -> None:
        resource = target.resource
        self.cluster.auth.record(
            AuditRecord(
                user.name,
                verb,
                resource.group,
                resource.plural,
                target.subresource,
                target.namespace,
                target.name,
                code,
                allowed,
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
        served = (subresource == "status" and resource.rtype.has_status) or (
            subresource == "scale" and resource.rtype.scale is not None
        )
        if subresource and not served:
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
        if target.subresource == "scale":
            return await self._scale(verb, target, request, user, send)
        if verb == "watch":
            await serve_watch(self.cluster, target, request, receive, send)
            return 200
        if verb == "list":
            await self._list(target, request, send)
            return 200
        if verb == "get":
            obj = core.get(resource, namespace, name)
            await self._object(send, 200, resource, obj, request)
            return 200
        ctx = write_context(request, user)
        if verb == "create":
            body = body_object(request)
            obj = core.create(resource, namespace, body, ctx, owned=True)
            code = 201
        elif verb == "update":
            obj = core.update(
                resource, namespace, name, body_object(request), ctx, target.subresource
            )
            code = 200
        elif verb == "patch":
            content_type = content_type_of(request)
            # An apply that creates its object answers 201, as the real server's.
            creates = (
                content_type in (APPLY_PATCH, APPLY_PATCH_CBOR)
                and not target.subresource
                and self.cluster.store.get(resource.rtype, namespace, name) is None
            )
            if creates:
                # The real server asks the authorizer for create (with the
                # name) before an apply creates: endpoints/handlers/patch.go.
                return await self._apply_creating(target, request, user, ctx, send)
            obj = core.patch(
                resource,
                namespace,
                name,
                content_type,
                body_of(request, content_type),
                ctx,
                subresource=target.subresource,
                force=request.flag("force"),
                owned=True,
            )
            code = 200
        elif verb == "delete":
            return await self._delete(target, request, ctx, send)
        elif verb == "deletecollection":
            return await self._delete_collection(target, request, ctx, send)
        else:
            raise errors.method_not_allowed()
        await self._object(send, code, resource, obj, request, ctx.warnings)
        return code

    async def _scale(
        self, verb: str, target: Target, request: Request, user: User, send: Send
    ) -> int:
        """``…/{name}/scale``: the object's replicas as an autoscaling/v1 Scale."""
        core, resource = self.cluster.core, target.resource
        where = (core, resource, target.namespace, target.name)
        if verb == "get":
            scale = read_scale(*where)
        elif verb == "update":
            scale = update_scale(*where, body_object(request), write_context(request, user))
        elif verb == "patch":
            content_type = content_type_of(request)
            scale = patch_scale(
                *where, content_type, body_of(request, content_type), write_context(request, user)
            )
        else:
            raise errors.method_not_allowed()
        await respond(send, 200, dumps(scale))
        return 200

    async def _apply_creating(
        self, target: Target, request: Request, user: User, ctx: Context, send: Send
    ) -> int:
        """A server-side apply of an object not there yet: authorized as
        ``create`` too (audited as such), answered 201 as the real server does."""
        code, allowed = 201, False
        try:
            self._authorize(user, "create", target)
            allowed = True
            content_type = content_type_of(request)
            obj = self.cluster.core.patch(
                target.resource,
                target.namespace,
                target.name,
                content_type,
                body_of(request, content_type),
                ctx,
                force=request.flag("force"),
                owned=True,
            )
        except ApiError as error:
            code = error.code
            raise
        finally:
            self._audit(user, "create", target, code, allowed)
        await self._object(send, code, target.resource, obj, request, ctx.warnings)
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
        if wants_table(request):
            shown = self.cluster.core.present(resource, obj)
            rv = shown["metadata"].get("resourceVersion", "")
            body = table(
                resource.rtype,
                resource.version.name,
                [shown],
                rv,
                request.query.get("includeObject", "Metadata"),
            )
            await respond(send, code, dumps(body), warnings=warnings)
            return
        await respond(send, code, self._json(resource, obj), warnings=warnings)

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
            fields=parse_field_selector(
                request.query.get("fieldSelector"), selectable_fields(resource)
            ),
            limit=int(request.query.get("limit") or 0),
            continue_token=request.query.get("continue", ""),
            resource_version=request.query.get("resourceVersion", ""),
            resource_version_match=request.query.get("resourceVersionMatch", ""),
        )
        if not wants_table(request):
            parts = [
                self.cluster.store.encoded(resource.rtype, o, resource.api_version) for o in items
            ]
            if all(part is not None for part in parts):
                head = list_head(resource, rv, token, remaining)
                await respond(send, 200, spliced(head, b"items", parts))
                return
        items = [core.present(resource, obj) for obj in items]
        if wants_table(request):
            body = table(
                resource.rtype,
                resource.version.name,
                items,
                str(rv),
                request.query.get("includeObject", "Metadata"),
                continue_token=token,
            )
            await respond(send, 200, dumps(body))
            return
        await respond(
            send, 200, dumps({**list_head(resource, rv, token, remaining), "items": items})
        )

    async def _delete(self, target: Target, request: Request, ctx: Context, send: Send) -> int:
        core = self.cluster.core
        options = delete_options(request)
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
            await respond(send, 200, dumps(status), warnings=ctx.warnings)
            return 200
        await respond(send, 200, dumps(core.present(resource, obj)), warnings=ctx.warnings)
        return 200

    async def _delete_collection(
        self, target: Target, request: Request, ctx: Context, send: Send
    ) -> int:
        core = self.cluster.core
        options = delete_options(request)
        items, _, _, _ = core.list(
            target.resource,
            target.namespace,
            labels=parse_label_selector(request.query.get("labelSelector")),
            fields=parse_field_selector(
                request.query.get("fieldSelector"), selectable_fields(target.resource)
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
        await respond(send, 200, dumps(body))
        return 200

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
        await respond(send, 200, dumps(result))


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
