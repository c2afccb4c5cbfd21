"""Ledger: entries browsed and filtered (kind, namespace, workload, time;
newest first, paged by ``seq``), an entry with its inclusion proof against
the latest signed checkpoint — checked in the browser by ``static/verify.js``
with the same algorithm as ``qmctl ledger verify`` — the checkpoints, and the
export. The newest page follows the ledger live: its entries are read anew
when an event whose transaction writes an entry arrives (:data:`LEDGER_EVENTS`).

Every read is the auditors' API's (``AuditService``): ``entries``,
``latest_checkpoint``, ``inclusion``, ``checkpoints``, ``export``. The entry
is served as its NDJSON export line, the very bytes ``qmctl ledger verify``
reads, so the browser hashes what an offline auditor would.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import iterate_in_threadpool
from starlette.concurrency import run_in_threadpool as run

from service.app.audit import AUDITORS
from service.app.errors import Invalid, NotFound
from service.console.web import CurrentViewer, Page, Services_, Viewer, render
from service.domain import events as types
from service.ledger.chain import CHAIN_VERSION
from service.ledger.checkpoint import Checkpoint, CheckpointError, parse_checkpoint_text
from service.ledger.entries import KINDS
from service.ledger.export import ExportRecord, export_line
from service.ledger.query import LedgerQuery

PAGE_SIZE = 50
#: A form's empty field is no filter: the patterns let it through.
Filter = Annotated[
    str | None, Query(max_length=253, pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$")
]
Namespace = Annotated[
    str | None, Query(max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")
]
Kind = Annotated[str | None, Query(max_length=64)]
#: ``datetime-local`` (UTC, as the form says) or RFC 3339.
Moment = Annotated[str | None, Query(max_length=40)]
Seq = Annotated[int, Path(ge=1, le=2**62)]
Cursor = Annotated[int | None, Query(ge=1, le=2**62)]
Limit = Annotated[int, Query(ge=1, le=500)]


def _filters(
    kind: Kind = None,
    namespace: Namespace = None,
    workload: Filter = None,
    since: Moment = None,
    until: Moment = None,
) -> dict[str, str | None]:
    """The listing's and the export's filters, from the query string (an
    empty form field is no filter)."""
    found = {
        "kind": kind,
        "namespace": namespace,
        "workload": workload,
        "since": since,
        "until": until,
    }
    return {k: (v or None) for k, v in found.items()}


Filters = Annotated[dict[str, str | None], Depends(_filters)]

#: The event types appended with ledger entries: the Workload transitions that
#: open or close an admission or record an estimate of what ran
#: (service/app/lifecycle.py), a submission and its refusal, an admin's change
#: (service/app/resources.py), a cluster's loss. The registry
#: (service/domain/events.py) does not say which types write entries. Two
#: entries come with none of these and show at the next: ``workload.ran`` as
#: measured (written by workers/metering.py with no event) and
#: ``cluster.returned`` (on ClusterSynced, a heartbeat that would re-read the
#: table at every beat).
LEDGER_EVENTS = (
    types.WORKLOAD_SUBMITTED,
    types.WORKLOAD_ADMITTED,
    types.WORKLOAD_PREEMPTED,
    types.WORKLOAD_EVICTED,
    types.WORKLOAD_REQUEUED,
    types.WORKLOAD_FINISHED,
    types.WORKLOAD_CANCELLED,
    types.CLUSTER_LOST,
    types.RESOURCE_CHANGED,
    types.RESOURCE_DELETED,
    types.SUBMISSION_REFUSED,
)


def moment(value: str | None, field: str) -> datetime | None:
    """A form's time: RFC 3339, or a zone-less ``datetime-local`` read as UTC."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise Invalid(f"{field} is not a time", [(field, "YYYY-MM-DDTHH:MM, UTC")]) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def _query(filters: dict[str, str | None], **paging: Any) -> LedgerQuery:
    kind = filters["kind"]
    if kind is not None and kind not in KINDS:
        raise Invalid("unknown kind", [("kind", f"one of {', '.join(KINDS)}")])
    try:
        return LedgerQuery(
            namespace=filters["namespace"],
            workload=filters["workload"],
            kinds=(kind,) if kind else (),
            since=moment(filters["since"], "since"),
            until=moment(filters["until"], "until"),
            **paging,
        )
    except ValueError as error:
        raise Invalid(str(error), [("until", str(error))]) from None


def _listing(
    viewer: Viewer, services: Any, filters: dict[str, str | None], before: int | None, limit: int
) -> dict[str, Any]:
    query = _query(filters, before_seq=before, newest_first=True, limit=limit)
    # Read before the entries: an entry they miss comes with an event after it.
    head = services.event_queries.head()
    found = services.audit.entries(viewer.principal, query)
    return {
        "entries": [{**e, "summary": summary(e["kind"], e["body"])} for e in found["items"]],
        "next": found.get("next"),
        "before": before,
        "limit": limit,
        "filters": filters,
        "query": _query_string(filters, limit),
        "kinds": KINDS,
        "head": head,
        "events": LEDGER_EVENTS,
    }


def _query_string(filters: dict[str, str | None], limit: int) -> str:
    """The filters (and a page size other than the default) as a query
    string's start, each pair followed by ``&``, for the page's links."""
    pairs = [(k, v) for k, v in filters.items() if v]
    if limit != PAGE_SIZE:
        pairs.append(("limit", str(limit)))
    return "".join(f"{k}={quote(v, safe='/')}&" for k, v in pairs)


def summary(kind: str, body: dict[str, Any]) -> str:
    """A few words of what an entry says, for the list."""
    words = {
        "workload.admitted": lambda: (
            f"admitted on {body.get('cluster')}"
            + (f", island {body['island']}" if body.get("island") else "")
        ),
        "workload.finished": lambda: f"{body.get('outcome')} on {body.get('cluster')}",
        "workload.preempted": lambda: f"preempted ({body.get('reason')})",
        "workload.evicted": lambda: f"evicted: {body.get('reason')}",
        "workload.ran": lambda: (
            f"ran {body.get('gpu_seconds', 0)} GPU-seconds ({body.get('measured')})"
        ),
        "quota.changed": lambda: (
            f"{body.get('object_kind')} {body.get('name')} changed by {body.get('actor')}"
        ),
        "config.changed": lambda: (
            f"{body.get('object_kind')} {body.get('name')} changed by {body.get('actor')}"
        ),
        "policy.refused": lambda: f"refused: {len(body.get('rules') or [])} rule(s)",
        "cluster.lost": lambda: f"{body.get('cluster')} lost",
        "cluster.returned": lambda: f"{body.get('cluster')} returned",
        "security.relaxed": lambda: f"{body.get('cluster_queue')} relaxed by {body.get('actor')}",
    }.get(kind)
    return words() if words else ""


def document(item: dict[str, Any]) -> dict[str, Any]:
    """The hashed document of an entry as ``AuditService.entries`` shows it
    (``service.ledger.chain.entry_document``'s fields)."""
    return {
        "v": CHAIN_VERSION,
        "seq": item["seq"],
        "entry_id": item["id"],
        "kind": item["kind"],
        "recorded_at": item["recordedAt"],
        "body": item["body"],
        "prev_hash": item["prevHash"],
    }


def signed_by(note: str) -> list[tuple[str, str]]:
    """(key name, key id in hex) of each signature line of a note."""
    signers = []
    for line in note.rpartition("\n\n")[2].splitlines():
        name, _, blob = line.removeprefix("\u2014 ").partition(" ")
        try:
            signers.append((name, base64.b64decode(blob, validate=True)[:4].hex()))
        except ValueError:
            signers.append((name, "?"))
    return signers


def parsed(note: str) -> Checkpoint:
    try:
        return parse_checkpoint_text(note.rpartition("\n\n")[0] + "\n")
    except CheckpointError as error:
        raise Invalid(f"the stored checkpoint does not parse: {error}") from None


def _entry(viewer: Viewer, services: Any, seq: int) -> dict[str, Any]:
    principal = viewer.principal
    found = services.audit.entries(principal, LedgerQuery(after_seq=seq - 1, limit=1))["items"]
    if not found or found[0]["seq"] != seq:
        raise NotFound(f"the ledger has no entry {seq}")
    item = found[0]
    line = export_line(ExportRecord(document(item), item["hash"])).decode().rstrip("\n")
    try:
        note: str | None = services.audit.latest_checkpoint(principal)
    except NotFound:
        note = None
    checkpoint = parsed(note) if note else None
    proof = None
    if checkpoint is not None and seq <= checkpoint.size:
        proof = services.audit.inclusion(principal, seq, checkpoint.size)
    return {
        "entry": item,
        "line": line,
        "note": note,
        "checkpoint": checkpoint,
        "signers": signed_by(note) if note else [],
        "proof": proof,
        "key": services.audit.verifier_key(principal) or "",
    }


def _checkpoints(viewer: Viewer, services: Any, after: int | None) -> dict[str, Any]:
    """A page of checkpoints, oldest first, after tree size ``after``."""
    notes = services.audit.checkpoints(
        viewer.principal, -1 if after is None else after, PAGE_SIZE + 1
    )
    rows = [_checkpoint_row(note) for note in notes[:PAGE_SIZE]]
    return {
        "rows": rows,
        "next": rows[-1]["size"] if len(notes) > PAGE_SIZE else None,
        "after": after,
        "key": services.audit.verifier_key(viewer.principal) or "",
    }


def _checkpoint_row(note: str) -> dict[str, Any]:
    checkpoint = parsed(note)
    root = base64.b64encode(checkpoint.root_hash).decode()
    return {"note": note, "size": checkpoint.size, "root": root, "signers": signed_by(note)}


def ledger_router() -> APIRouter:
    router = APIRouter()

    @router.get("/ledger")
    async def ledger(
        viewer: CurrentViewer,
        services: Services_,
        wanted: Filters,
        before: Cursor = None,
        limit: Limit = PAGE_SIZE,
    ) -> Response:
        listing = await run(_listing, viewer, services, wanted, before, limit)
        return render(viewer, "ledger.html", {"title": "Ledger", **listing})

    @router.get("/ledger/rows")
    async def rows(
        viewer: CurrentViewer,
        services: Services_,
        wanted: Filters,
        before: Cursor = None,
        limit: Limit = PAGE_SIZE,
    ) -> Response:
        """The entries and the pager alone, which the newest page re-reads live."""
        listing = await run(_listing, viewer, services, wanted, before, limit)
        return render(viewer, "_ledger_rows.html", listing)

    @router.get("/ledger/entries/{seq}")
    async def entry(viewer: CurrentViewer, services: Services_, seq: Seq) -> Response:
        found = await run(_entry, viewer, services, seq)
        return render(viewer, "ledger_entry.html", {"title": f"Ledger entry {seq}", **found})

    @router.get("/ledger/checkpoints")
    async def checkpoints(
        viewer: CurrentViewer,
        services: Services_,
        after: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    ) -> Response:
        found = await run(_checkpoints, viewer, services, after)
        return render(viewer, "ledger_checkpoints.html", {"title": "Checkpoints", **found})

    @router.get("/ledger/export")
    async def export(
        viewer: CurrentViewer,
        services: Services_,
        wanted: Filters,
        format: Literal["ndjson", "csv"] = "ndjson",
        filtered: bool = False,
    ) -> StreamingResponse:
        """The API's export (``GET /v1/ledger/export``), as a download."""
        query = _query(wanted) if filtered else None
        lines = await run(services.audit.export, viewer.principal, format, query)
        media = "application/x-ndjson" if format == "ndjson" else "text/csv"
        name = f"ledger{'-filtered' if filtered else ''}.{format}"
        headers = {"Content-Disposition": f'attachment; filename="{name}"'}
        return StreamingResponse(iterate_in_threadpool(lines), media_type=media, headers=headers)

    return router


PAGE = Page("Ledger", "/ledger", AUDITORS, ledger_router())
