"""Workloads: a filtered list, paged by the API's keyset cursor, and a
workload's page — pod sets, placement, conditions, its events as a timeline,
its ledger entries (for auditors), why it waits, and cancel.

Every read is the API's: ``ResourceService.list`` / ``get`` (the same field
selectors and ``continue`` tokens as ``GET /v1/workloads``),
``SubmissionService.explain`` and ``cancel``, ``AuditService.entries``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool as run

from service.app import overview
from service.app.audit import AUDITORS
from service.app.auth import Role
from service.app.errors import AppError, Invalid
from service.app.kinds import KINDS
from service.app.lifecycle import (
    ADMITTED,
    CANCELLED,
    CANCELLING,
    EVICTED,
    FINISHED,
    PENDING,
    RUNNING,
)
from service.console import words
from service.console.web import CurrentViewer, Page, Services_, Viewer, render
from service.ledger.query import LedgerQuery

WORKLOADS = KINDS["workloads"]
PAGE_SIZE = 50
STATES = (PENDING, ADMITTED, RUNNING, EVICTED, CANCELLING, FINISHED, CANCELLED)
#: The live stream's event types that change what these pages show.
WORKLOAD_EVENTS = (
    "WorkloadSubmitted",
    "WorkloadPending",
    "WorkloadAdmitted",
    "WorkloadDispatched",
    "WorkloadRunning",
    "WorkloadFinished",
    "WorkloadPreempted",
    "WorkloadEvicted",
    "WorkloadRequeued",
    "WorkloadCancelled",
)
NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
NAMESPACE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: A filter form sends its empty fields too ("queue="): empty is no filter.
Filter = Annotated[str | None, Query(max_length=253, pattern=r"^$|" + NAME)]
Namespace = Annotated[str | None, Query(max_length=63, pattern=r"^$|" + NAMESPACE)]
#: One of STATES (checked in _listing, which names them all).
State = Annotated[str | None, Query(max_length=32)]
NamespacePath = Annotated[str, Path(max_length=63, pattern=NAMESPACE)]
NamePath = Annotated[str, Path(max_length=253, pattern=NAME)]
#: Filters and the field selector each becomes (service/app/selectors.py).
FIELDS = {
    "queue": "spec.queueName",
    "state": "status.state",
    "cluster": "status.admission.cluster",
    "priority": "spec.priorityClassName",
}


def _namespaces(viewer: Viewer) -> list[str] | None:
    """The namespaces a submitter chooses among; None for fleet-wide readers."""
    principal = viewer.principal
    if principal.roles - {Role.SUBMITTER}:
        return None
    return sorted(ns for ns in principal.namespaces if ns != "*")


def _listing(
    viewer: Viewer, services: Any, filters: dict[str, str | None], cursor: str | None
) -> dict[str, Any]:
    if filters["state"] is not None and filters["state"] not in STATES:
        raise Invalid("unknown state", [("state", f"one of {', '.join(STATES)}")])
    choices = _namespaces(viewer)
    namespace = filters["namespace"]
    if namespace is None and choices is not None:
        namespace = choices[0] if choices else None
        if namespace is None:
            raise Invalid("choose a namespace", [("namespace", "required for your role")])
    selector = ",".join(f"{FIELDS[k]}={v}" for k, v in filters.items() if k in FIELDS and v)
    page = services.resources.list(
        viewer.principal, "workloads", namespace, None, selector or None, PAGE_SIZE, cursor
    )
    rows = [_row(obj) for obj in page.items]
    return {
        "rows": rows,
        "next": page.continue_token,
        "cursor": cursor,
        "head": int(page.resource_version),
        "filters": {**filters, "namespace": namespace},
        "namespaces": choices,
        "states": STATES,
    }


def _row(obj: dict[str, Any]) -> dict[str, Any]:
    """A workload's row; a serving workload's clusters and islands are its
    admitted replicas' (shortened past two, the title names them all)."""
    spec, status, meta = obj["spec"], obj.get("status") or {}, obj["metadata"]
    held = overview.admissions(status)
    cluster, clusters = words.listed(a.get("cluster") for a in held)
    island, islands = words.listed(i for a in held for i in _islands(a))
    return {
        "namespace": meta["namespace"],
        "name": meta["name"],
        "queue": spec.get("queueName"),
        "state": status.get("state", PENDING),
        "cluster": cluster,
        "clusters": clusters,
        "island": island,
        "islands": islands,
        "priority": spec.get("priorityClassName") or spec.get("priority", 0),
        "gpus": words.gpus(spec, status),
        "created": meta.get("creationTimestamp"),
    }


def _islands(admission: Mapping[str, Any]) -> list[str]:
    """The islands an admission holds: its own, else its pod sets'."""
    if admission.get("island"):
        return [str(admission["island"])]
    found = (i for a in admission.get("podSetAssignments") or () for i in a.get("islands") or ())
    return [str(i) for i in dict.fromkeys(found)]


def _units(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A serving workload's admitted replicas, by replica: where each runs."""
    found = []
    for unit in status.get("replicaAdmissions") or ():
        admission = unit.get("admission") or {}
        found.append(
            {
                "replica": unit.get("replica"),
                "cluster": admission.get("cluster") or "-",
                "island": ", ".join(admission.get("islands") or ())
                or admission.get("island")
                or "-",
                "admitted": unit.get("admittedAt") or admission.get("admittedAt"),
            }
        )
    return found


def _detail(viewer: Viewer, services: Any, namespace: str, name: str) -> dict[str, Any]:
    """Everything a workload's page shows, read with the viewer's principal."""
    head = services.event_queries.head()
    obj = services.resources.get(viewer.principal, "workloads", namespace, name)
    status = obj.get("status") or {}
    state = status.get("state", PENDING)
    explanation = replicas = None
    units = _units(status)
    # A serving workload: how many replicas are admitted of those asked, and why not all.
    serving = bool(units or obj["spec"].get("replicas"))
    if state == PENDING or serving:
        found = services.submissions.explain(viewer.actor, namespace, name)
        explanation = found if state == PENDING else None
        replicas = found.get("replicas") if serving else None
    entries: list[dict[str, Any]] = []
    if viewer.may(AUDITORS):
        found = services.audit.entries(
            viewer.principal, LedgerQuery(namespace=namespace, workload=name, limit=100)
        )
        entries = found["items"]
    history = overview.timeline(services.engine, viewer.principal, namespace, name)
    may_cancel = viewer.may(WORKLOADS.write) and viewer.principal.in_namespace(namespace)
    return {
        "obj": obj,
        "row": _row(obj),
        "status": status,
        "admission": status.get("admission") or {},
        "explain": explanation,
        "replicas": replicas,
        "units": units,
        "entries": entries,
        "timeline": words.timeline(history, viewer.principal),
        "may_cancel": may_cancel and state not in (FINISHED, CANCELLED, CANCELLING),
        "head": head,
    }


def workloads_router() -> APIRouter:
    router = APIRouter()

    def filters(
        namespace: str | None,
        queue: str | None,
        state: str | None,
        cluster: str | None,
        priority: str | None,
    ) -> dict[str, str | None]:
        found = {
            "namespace": namespace,
            "queue": queue,
            "state": state,
            "cluster": cluster,
            "priority": priority,
        }
        return {k: (v or None) for k, v in found.items()}

    @router.get("/workloads")
    async def workloads(
        viewer: CurrentViewer,
        services: Services_,
        namespace: Namespace = None,
        queue: Filter = None,
        state: State = None,
        cluster: Filter = None,
        priority: Filter = None,
        continue_: Annotated[str | None, Query(alias="continue", max_length=512)] = None,
    ) -> Response:
        wanted = filters(namespace, queue, state, cluster, priority)
        listing = await run(_listing, viewer, services, wanted, continue_)
        return render(viewer, "workloads.html", {"title": "Workloads", **_live(listing)})

    @router.get("/workloads/rows")
    async def rows(
        viewer: CurrentViewer,
        services: Services_,
        namespace: Namespace = None,
        queue: Filter = None,
        state: State = None,
        cluster: Filter = None,
        priority: Filter = None,
        continue_: Annotated[str | None, Query(alias="continue", max_length=512)] = None,
    ) -> Response:
        wanted = filters(namespace, queue, state, cluster, priority)
        listing = await run(_listing, viewer, services, wanted, continue_)
        return render(viewer, "_workload_rows.html", _live(listing))

    @router.get("/workloads/{namespace}/{name}")
    async def workload(
        viewer: CurrentViewer, services: Services_, namespace: NamespacePath, name: NamePath
    ) -> Response:
        detail = await run(_detail, viewer, services, namespace, name)
        return render(viewer, "workload.html", {"title": f"{namespace}/{name}", **detail})

    @router.get("/workloads/{namespace}/{name}/detail")
    async def workload_detail(
        viewer: CurrentViewer, services: Services_, namespace: NamespacePath, name: NamePath
    ) -> Response:
        detail = await run(_detail, viewer, services, namespace, name)
        return render(viewer, "_workload_detail.html", detail)

    @router.post("/workloads/{namespace}/{name}/cancel")
    async def cancel(
        request: Request,
        viewer: CurrentViewer,
        services: Services_,
        namespace: NamespacePath,
        name: NamePath,
    ) -> Response:
        """Cancel (the API's ``POST .../cancel``), after the page's confirmation."""
        notice = None
        try:
            await run(services.submissions.cancel, viewer.actor, namespace, name, None)
        except AppError as error:
            if error.status in (401, 403, 404):
                raise
            notice = error.detail
        if "hx-request" not in request.headers:
            return RedirectResponse(f"{viewer.base}/workloads/{namespace}/{name}", 303)
        detail = await run(_detail, viewer, services, namespace, name)
        return render(viewer, "_workload_detail.html", {**detail, "notice": notice})

    return router


def _live(listing: dict[str, Any]) -> dict[str, Any]:
    return {**listing, "events": WORKLOAD_EVENTS}


PAGE = Page("Workloads", "/workloads", WORKLOADS.read, workloads_router())
