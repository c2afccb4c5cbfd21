"""``/v1/ledger/…`` and ``/v1/usage``: the auditors' read-only API, and
signing a checkpoint on demand."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import iterate_in_threadpool
from starlette.concurrency import run_in_threadpool as run

from service.api import recovery
from service.api.deps import CurrentPrincipal, Deps
from service.api.indoubt import settled
from service.app.errors import Invalid
from service.ledger.query import LedgerQuery

Text = Annotated[str | None, Query(max_length=253)]
RFC3339 = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
Moment = Annotated[
    str | None, Query(pattern=RFC3339, description="RFC 3339, e.g. 2026-11-30T00:00:00Z")
]


def _moment(value: str | None, field: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as error:
        raise Invalid(f"{field} is not a date-time", [(field, str(error))]) from None


def _query(
    namespace: Text = None,
    local_queue: Annotated[str | None, Query(alias="localQueue", max_length=253)] = None,
    cluster_queue: Annotated[str | None, Query(alias="clusterQueue", max_length=253)] = None,
    cluster: Text = None,
    workload: Text = None,
    actor: Text = None,
    flavor: Text = None,
    kind: Annotated[list[str] | None, Query(max_length=20)] = None,
    since: Moment = None,
    until: Moment = None,
    after: Annotated[int | None, Query(ge=0, description="Entries after this seq")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> LedgerQuery:
    try:
        return LedgerQuery(
            namespace=namespace,
            local_queue=local_queue,
            cluster_queue=cluster_queue,
            cluster=cluster,
            workload=workload,
            actor=actor,
            flavor=flavor,
            kinds=tuple(kind or ()),
            since=_moment(since, "since"),
            until=_moment(until, "until"),
            after_seq=after,
            limit=limit,
        )
    except ValueError as error:
        raise Invalid(str(error), [("query", str(error))]) from None


Filters = Annotated[LedgerQuery, Depends(_query)]


def ledger_router() -> APIRouter:
    router = APIRouter(tags=["Ledger"])

    @router.get("/v1/ledger/entries")
    async def entries(principal: CurrentPrincipal, deps: Deps, query: Filters) -> Any:
        """Entries filtered by namespace, queues, cluster, flavor, kind, actor,
        workload and time, oldest first; ``next`` is the cursor for ``after``."""
        return await run(deps.audit.entries, principal, query)

    @router.get(
        "/v1/ledger/export",
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "NDJSON (one entry per line) or CSV",
                "content": {"application/x-ndjson": {}, "text/csv": {}},
            }
        },
    )
    async def export(
        principal: CurrentPrincipal,
        deps: Deps,
        query: Filters,
        format: Literal["ndjson", "csv"] = "ndjson",
        filtered: bool = False,
    ) -> StreamingResponse:
        """The whole ledger (or, with ``filtered=true``, the entries matching
        the filters) as NDJSON that ``quartermaster ledger verify`` checks
        offline, or CSV; streamed in constant memory."""
        lines = await run(deps.audit.export, principal, format, query if filtered else None)
        media = "application/x-ndjson" if format == "ndjson" else "text/csv"
        return StreamingResponse(iterate_in_threadpool(lines), media_type=media)

    @router.get("/v1/ledger/checkpoints/latest", response_class=PlainTextResponse)
    async def latest(principal: CurrentPrincipal, deps: Deps) -> str:
        """The latest signed checkpoint (C2SP tlog-checkpoint note)."""
        note: str = await run(deps.audit.latest_checkpoint, principal)
        return note

    @router.post("/v1/ledger/checkpoints", response_class=PlainTextResponse, status_code=201)
    async def publish(request: Request, principal: CurrentPrincipal, deps: Deps) -> Response:
        """Sign a checkpoint now (admin); the same as the periodic one."""
        publish = deps.audit.publish
        return await settled(request, recovery.checkpoint(), _published, publish, principal)

    @router.get("/v1/ledger/proofs/inclusion")
    async def inclusion(
        principal: CurrentPrincipal,
        deps: Deps,
        seq: Annotated[int, Query(ge=1)],
        size: Annotated[int | None, Query(ge=1)] = None,
    ) -> Any:
        """Entry ``seq`` is in the tree of ``size`` (default: the current size)."""
        return await run(deps.audit.inclusion, principal, seq, size)

    @router.get("/v1/ledger/proofs/consistency")
    async def consistency(
        principal: CurrentPrincipal,
        deps: Deps,
        from_: Annotated[int, Query(alias="from", ge=1)],
        to: Annotated[int | None, Query(ge=1)] = None,
    ) -> Any:
        """The tree of size ``from`` is a prefix of the tree of size ``to``."""
        return await run(deps.audit.consistency, principal, from_, to)

    @router.get("/v1/usage")
    async def usage(
        principal: CurrentPrincipal,
        deps: Deps,
        granularity: Literal["hour", "day", "month"] = "day",
        by: Annotated[list[str] | None, Query(max_length=5)] = None,
        as_of: Annotated[
            str | None, Query(alias="asOf", pattern=RFC3339, description="RFC 3339")
        ] = None,
    ) -> Any:
        """GPU-, CPU- and memory-hours per period and group, from the ledger."""
        moment = _moment(as_of, "asOf")
        rows = await run(deps.audit.usage, principal, granularity, by or ["namespace"], moment)
        return {"items": rows}

    return router


async def _published(note: str) -> Response:
    return PlainTextResponse(note, status_code=201)
