"""Routers: thin translations of HTTP to ``service.app`` calls.

Admin kinds share one set of generated routes (list, create, get, replace,
patch, delete); workloads have their own, and tokens (service/api/tokens.py)
and events theirs. Bodies are read
by ``read_body`` (JSON or YAML) and validated in the app layer, so that every
error names its field the same way whatever the media type.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import APIRouter, Header, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool as run

from service.api import recovery
from service.api.deps import CurrentActor, CurrentPrincipal, Deps, read_body
from service.api.group_commit import DATABASE_DOWN, GroupCommit
from service.api.indoubt import CommitInDoubt, OutcomeUnknown, Settlements, settled
from service.api.openapi import body_schema, list_schema, object_schema
from service.app.auth import Principal, require
from service.app.bootstrap import Services as Container
from service.app.errors import AppError, Invalid
from service.app.kinds import ADMIN_KINDS, KINDS, Kind
from service.app.resources import Actor, Page
from service.app.submissions import MAX_BULK, ItemResult, Outcome, Submission

T = TypeVar("T")
NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
NameParam = Annotated[str, Query(max_length=253, pattern=NAME)]
Limit = Annotated[int | None, Query(ge=1, le=1000, description="Page size (max 1000)")]
Continue = Annotated[
    str | None, Query(alias="continue", max_length=512, description="Token from the last page")
]
LabelSel = Annotated[str | None, Query(alias="labelSelector", max_length=4096)]
FieldSel = Annotated[str | None, Query(alias="fieldSelector", max_length=4096)]
IfMatch = Annotated[str | None, Header(alias="If-Match", max_length=64)]


def _r(status: int, schema: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    return {status: schema}


def _page(kind: str, page: Page) -> Response:
    metadata: dict[str, Any] = {"resourceVersion": page.resource_version}
    if page.continue_token:
        metadata["continue"] = page.continue_token
    body = {
        "apiVersion": "quartermaster.dev/v1",
        "kind": f"{kind}List",
        "metadata": metadata,
        "items": page.items,
    }
    return Response(json_bytes(body), media_type="application/json")


def json_bytes(value: Any) -> bytes:
    """Compact JSON; orjson, or the standard encoder for what orjson cannot
    write (an integer beyond 64 bits, which JSON bodies may carry)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def _etag(obj: dict[str, Any], status: int = 200) -> Response:
    """The object as JSON with its version as ETag. Serialised here, not by
    FastAPI's encoder: objects are plain JSON already, and the encoder's walk
    over pod templates costs more than the rest of a submission."""
    return Response(
        json_bytes(obj),
        status_code=status,
        media_type="application/json",
        headers={"ETag": f'"{obj["metadata"]["resourceVersion"]}"'},
    )


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(json_bytes(obj), status_code=status, media_type="application/json")


async def _warned(deps: Container, response: Response, obj: dict[str, Any]) -> Response:
    """A ClusterQueue whose quota no node can use, warned of as Kubernetes
    warns (``Warning: 299 - "..."``, RFC 7234), for ``qmctl apply`` to print.
    Advisory: with the database gone since the write, none (the write stands)."""
    if obj.get("kind") == "ClusterQueue":
        try:
            warnings = await run(deps.submissions.quota_warnings, obj)
        except DATABASE_DOWN:
            warnings = []
        for text in warnings:
            quoted = text.replace("\\", "\\\\").replace('"', '\\"')
            response.headers.append("Warning", f'299 - "{quoted}"')
    return response


NamespacePath = Annotated[
    str, Path(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
NamePath = Annotated[str, Path(min_length=1, max_length=253, pattern=NAME)]


def _scoped(func: Callable[..., Any], namespaced: bool) -> Callable[..., Any]:
    """The route function with ``namespace`` as a path parameter, or without
    it for cluster-scoped kinds (so that it is not mistaken for a query
    parameter); ``name`` gets the DNS-subdomain pattern."""
    signature = inspect.signature(func)
    params = []
    for original in signature.parameters.values():
        param = original
        if param.name == "namespace":
            if not namespaced:
                continue
            param = param.replace(annotation=NamespacePath, default=inspect.Parameter.empty)
        elif param.name == "name":
            param = param.replace(annotation=NamePath)
        params.append(param)
    params.sort(key=lambda p: p.default is not inspect.Parameter.empty)

    @functools.wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return await func(*args, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return wrapper


def _admin_routes(router: APIRouter, kind: Kind) -> None:
    if kind.namespaced:
        base = f"/v1/namespaces/{{namespace}}/{kind.plural}"
    else:
        base = f"/v1/{kind.plural}"
    item = base + "/{name}"
    tag = kind.kind
    read_body_extra = body_schema(kind)
    one: dict[int | str, dict[str, Any]] = {200: object_schema(kind)}

    async def create(
        request: Request,
        actor: CurrentActor,
        deps: Deps,
        namespace: str = "",
    ) -> Any:
        require(actor.principal, kind.write, namespace if kind.namespaced else None)
        body = await read_body(request, deps.settings.max_body_bytes)

        async def render(obj: dict[str, Any]) -> Response:
            return await _warned(deps, _etag(obj, 201), obj)

        recover = recovery.resource(kind, namespace, recovery.name_of(body))
        create = deps.resources.create
        return await settled(request, recover, render, create, actor, kind.plural, namespace, body)

    async def list_(
        principal: CurrentPrincipal,
        deps: Deps,
        namespace: str = "",
        limit: Limit = None,
        continue_: Continue = None,
        label_selector: LabelSel = None,
        field_selector: FieldSel = None,
    ) -> Any:
        page = await run(
            deps.resources.list,
            principal,
            kind.plural,
            namespace if kind.namespaced else None,
            label_selector,
            field_selector,
            limit,
            continue_,
        )
        return _page(kind.kind, page)

    async def get(
        principal: CurrentPrincipal,
        deps: Deps,
        name: str,
        namespace: str = "",
    ) -> Any:
        return _etag(await run(deps.resources.get, principal, kind.plural, namespace, name))

    def _update(method: str) -> Callable[..., Any]:
        """PUT (replace) and PATCH (merge patch): a body, then the same call."""

        async def update(
            request: Request,
            actor: CurrentActor,
            deps: Deps,
            name: str,
            if_match: IfMatch = None,
            namespace: str = "",
        ) -> Any:
            require(actor.principal, kind.write, namespace if kind.namespaced else None)
            body = await read_body(request, deps.settings.max_body_bytes)
            handler = getattr(deps.resources, method)

            async def render(obj: dict[str, Any]) -> Response:
                return await _warned(deps, _etag(obj), obj)

            recover = recovery.resource(kind, namespace, name)
            args = (actor, kind.plural, namespace, name, body, if_match)
            return await settled(request, recover, render, handler, *args)

        update.__name__ = method
        return update

    replace, patch = _update("replace"), _update("patch")

    async def delete(
        request: Request,
        actor: CurrentActor,
        deps: Deps,
        name: str,
        if_match: IfMatch = None,
        namespace: str = "",
    ) -> Any:
        recover = recovery.resource(kind, namespace, name)
        args = (actor, kind.plural, namespace, name, if_match)
        return await settled(request, recover, _rendered, deps.resources.delete, *args)

    create, list_, get, replace, patch, delete = (
        _scoped(f, kind.namespaced) for f in (create, list_, get, replace, patch, delete)
    )
    common: dict[str, Any] = {"tags": [tag]}
    router.add_api_route(
        base,
        list_,
        methods=["GET"],
        summary=f"List {kind.plural}",
        responses={200: list_schema(kind)},
        **common,
    )
    router.add_api_route(
        base,
        create,
        methods=["POST"],
        summary=f"Create a {kind.kind}",
        status_code=201,
        openapi_extra=read_body_extra,
        responses={201: object_schema(kind)},
        **common,
    )
    router.add_api_route(
        item, get, methods=["GET"], summary=f"Get a {kind.kind}", responses=one, **common
    )
    router.add_api_route(
        item,
        replace,
        methods=["PUT"],
        summary=f"Replace a {kind.kind}",
        openapi_extra=read_body_extra,
        responses=one,
        **common,
    )
    router.add_api_route(
        item,
        patch,
        methods=["PATCH"],
        summary=f"Merge-patch a {kind.kind} (RFC 7386)",
        openapi_extra=body_schema(kind, patch=True),
        responses=one,
        **common,
    )
    router.add_api_route(
        item, delete, methods=["DELETE"], summary=f"Delete a {kind.kind}", responses=one, **common
    )
    if kind.namespaced:

        async def list_all(
            principal: CurrentPrincipal,
            deps: Deps,
            limit: Limit = None,
            continue_: Continue = None,
            label_selector: LabelSel = None,
            field_selector: FieldSel = None,
        ) -> Any:
            page = await run(
                deps.resources.list,
                principal,
                kind.plural,
                None,
                label_selector,
                field_selector,
                limit,
                continue_,
            )
            return _page(kind.kind, page)

        router.add_api_route(
            f"/v1/{kind.plural}",
            list_all,
            methods=["GET"],
            summary=f"List {kind.plural} in all namespaces",
            responses={200: list_schema(kind)},
            **common,
        )


def admin_router() -> APIRouter:
    router = APIRouter()
    for kind in ADMIN_KINDS:
        _admin_routes(router, kind)
    return router


# -- workloads ---------------------------------------------------------------------------


SUBMIT_PATH = "/v1/namespaces/{namespace}/workloads"
WORKLOADS = KINDS["workloads"]
#: Kubernetes' Scale, as much of it as a scale request reads.
SCALE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["replicas"],
                            "properties": {
                                "replicas": {"type": "integer", "minimum": 1, "maximum": 100000}
                            },
                        }
                    },
                }
            }
        },
    }
}


async def submit_workload(request: Request, namespace: str, principal: Principal) -> Response:
    """The submit route's handler, for FastAPI's route and for the fast path
    that serves the same route without FastAPI's per-request machinery
    (service/api/fastpath.py)."""
    deps: Container = request.app.state.container
    actor = Actor(principal, request.headers.get("x-request-id"))
    require(principal, WORKLOADS.write, namespace)  # before a byte of the body is read
    body = await read_body(request, deps.settings.max_body_bytes)
    workload = deps.submissions.parse(actor, namespace, body)
    committer: GroupCommit[Submission, Outcome] = request.app.state.group_commit
    submission = Submission(actor, namespace, workload)
    try:
        outcome = await committer.submit(submission)
    except CommitInDoubt as doubt:
        settlements: Settlements = request.app.state.settlements
        later = functools.partial(settlements.item_outcome, doubt, submission)
        raise OutcomeUnknown(later, _created) from None
    if isinstance(outcome, AppError):
        raise outcome
    return _etag(outcome, 201)


def workload_router() -> APIRouter:
    from service.app.kinds import KINDS

    kind = KINDS["workloads"]
    router = APIRouter(tags=["Workload"])
    base = SUBMIT_PATH

    @router.post(
        base,
        status_code=201,
        openapi_extra=body_schema(kind, submission=True),
        responses={201: object_schema(kind)},
    )
    async def submit(
        namespace: NamespacePath, request: Request, principal: CurrentPrincipal
    ) -> Any:
        """Submit a Workload, or a job manifest of any kind in JOB_KINDS."""
        return await submit_workload(request, namespace, principal)

    @router.get(base, responses={200: list_schema(kind)})
    async def list_workloads(
        namespace: NamespacePath,
        principal: CurrentPrincipal,
        deps: Deps,
        limit: Limit = None,
        continue_: Continue = None,
        label_selector: LabelSel = None,
        field_selector: FieldSel = None,
    ) -> Any:
        page = await run(
            deps.resources.list,
            principal,
            "workloads",
            namespace,
            label_selector,
            field_selector,
            limit,
            continue_,
        )
        return _page("Workload", page)

    @router.get("/v1/workloads", responses={200: list_schema(kind)})
    async def list_all_workloads(
        principal: CurrentPrincipal,
        deps: Deps,
        limit: Limit = None,
        continue_: Continue = None,
        label_selector: LabelSel = None,
        field_selector: FieldSel = None,
    ) -> Any:
        page = await run(
            deps.resources.list,
            principal,
            "workloads",
            None,
            label_selector,
            field_selector,
            limit,
            continue_,
        )
        return _page("Workload", page)

    @router.get(base + "/{name}", responses={200: object_schema(kind)})
    async def get_workload(
        namespace: NamespacePath, name: NamePath, principal: CurrentPrincipal, deps: Deps
    ) -> Any:
        return _etag(await run(deps.resources.get, principal, "workloads", namespace, name))

    @router.delete(base + "/{name}", responses={200: object_schema(kind)})
    async def cancel_workload(
        namespace: NamespacePath,
        name: NamePath,
        request: Request,
        actor: CurrentActor,
        deps: Deps,
        if_match: IfMatch = None,
    ) -> Any:
        """Cancel: a pending workload is dropped; an admitted one is evicted."""
        return await _cancel(request, deps, actor, namespace, name, if_match)

    @router.post(base + "/{name}/cancel", responses={200: object_schema(kind)})
    async def cancel_workload_post(
        namespace: NamespacePath,
        name: NamePath,
        request: Request,
        actor: CurrentActor,
        deps: Deps,
        if_match: IfMatch = None,
    ) -> Any:
        """The same as DELETE, for clients that prefer a verb."""
        return await _cancel(request, deps, actor, namespace, name, if_match)

    @router.get(base + "/{name}/scale")
    async def get_scale(
        namespace: NamespacePath, name: NamePath, actor: CurrentActor, deps: Deps
    ) -> Any:
        """Kubernetes' Scale of a serving workload: replicas asked and admitted."""
        return await run(deps.submissions.get_scale, actor, namespace, name)

    @router.patch(base + "/{name}/scale", openapi_extra=SCALE_BODY)
    async def scale(
        namespace: NamespacePath,
        name: NamePath,
        request: Request,
        actor: CurrentActor,
        deps: Deps,
        if_match: IfMatch = None,
    ) -> Any:
        """Set a serving workload's replicas: ``{"spec": {"replicas": n}}``. A
        commit cut short is settled as a cancel's is (``settled``)."""
        require(actor.principal, WORKLOADS.write, namespace)  # before the body is read
        body = await read_body(request, deps.settings.max_body_bytes)
        recover = recovery.scale(namespace, name)
        args = (actor, namespace, name, body, if_match)
        return await settled(request, recover, _rendered, deps.submissions.scale, *args)

    @router.get(base + "/{name}/explain")
    async def explain(
        namespace: NamespacePath, name: NamePath, actor: CurrentActor, deps: Deps
    ) -> Any:
        """State, reason, message, position in the queue, and what it waits for."""
        return await run(deps.submissions.explain, actor, namespace, name)

    @router.post(
        "/v1/namespaces/{namespace}/bulk/workloads",
        responses={
            207: {"description": "Some items failed; each result says why"},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["items"],
                            "properties": {
                                "items": {
                                    "type": "array",
                                    "maxItems": MAX_BULK,
                                    "items": {"type": "object"},
                                }
                            },
                        }
                    }
                },
            }
        },
    )
    async def bulk(
        namespace: NamespacePath, request: Request, actor: CurrentActor, deps: Deps
    ) -> Any:
        """Up to 5,000 submissions; each is all-or-nothing, with its own result."""
        require(actor.principal, WORKLOADS.write, namespace)  # before the body is read
        body = await read_body(request, deps.settings.max_bulk_body_bytes, max_items=MAX_BULK)
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise Invalid("a bulk body is {items: [...]}", [("items", "expected an array")])
        not_objects = [i for i, item in enumerate(items) if not isinstance(item, dict)]
        if not_objects:
            raise Invalid(
                "every item must be an object",
                [(f"items[{i}]", "expected an object") for i in not_objects[:100]],
            )
        if len(items) > MAX_BULK:
            raise Invalid(
                f"at most {MAX_BULK} items per request", [("items", f"{len(items)} items")]
            )
        recover = recovery.bulk(namespace, items)
        args = (actor, namespace, items)
        return await settled(request, recover, _bulk_answer, deps.submissions.bulk, *args)

    return router


async def _created(obj: dict[str, Any]) -> Response:
    return _etag(obj, 201)


async def _rendered(obj: dict[str, Any]) -> Response:
    return json_response(obj)


async def _cancel(
    request: Request, deps: Container, actor: Actor, namespace: str, name: str, if_match: str | None
) -> Response:
    recover = recovery.resource(WORKLOADS, namespace, name)
    args = (actor, namespace, name, if_match)
    return await settled(request, recover, _rendered, deps.submissions.cancel, *args)


async def _bulk_answer(results: list[ItemResult]) -> Response:
    """200 when every item was created, else 207: a result per item."""
    out = []
    for r in results:
        entry: dict[str, Any] = {"index": r.index, "name": r.name, "status": r.status}
        if r.error is not None:
            entry["error"] = {
                "type": "https://quartermaster.dev/problems/" + r.error.kind,
                "title": r.error.title,
                "detail": r.error.detail,
                "errors": [{"field": f, "message": m} for f, m in r.error.errors],
            }
        elif r.object is not None:
            entry["resourceVersion"] = r.object["metadata"]["resourceVersion"]
            entry["uid"] = r.object["metadata"]["uid"]
        out.append(entry)
    created = sum(1 for r in results if r.error is None)
    status = 200 if created == len(results) else 207
    answer = {"created": created, "failed": len(results) - created, "results": out}
    return json_response(answer, status)
