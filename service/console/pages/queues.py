"""Queues: the cohort tree with, per ClusterQueue and flavor, nominal quota,
usage, borrowed and lent as bars; pending counts with their top reasons;
fair-share values where fair sharing is on (``service.app.overview.queues``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool as run

from service.app import overview
from service.app.kinds import KINDS
from service.console.pages.workloads import WORKLOAD_EVENTS
from service.console.web import CurrentViewer, Page, Services_, Settings_, Viewer, render
from service.console.words import reason_words

EVENTS = ("ResourceChanged", "ResourceDeleted", *WORKLOAD_EVENTS)


def _queues(viewer: Viewer, services: Any, fair_sharing: bool) -> dict[str, Any]:
    head = services.event_queries.head()
    tree = overview.queues(services.engine, viewer.principal, fair_sharing)
    return {"tree": tree, "head": head, "events": EVENTS, "reason_words": reason_words}


def queues_router() -> APIRouter:
    router = APIRouter()

    @router.get("/queues")
    async def queues(viewer: CurrentViewer, services: Services_, settings: Settings_) -> Response:
        found = await run(_queues, viewer, services, settings.fair_sharing)
        return render(viewer, "queues.html", {"title": "Queues", **found})

    @router.get("/queues/tree")
    async def tree(viewer: CurrentViewer, services: Services_, settings: Settings_) -> Response:
        found = await run(_queues, viewer, services, settings.fair_sharing)
        return render(viewer, "_queue_tree.html", found)

    return router


PAGE = Page("Queues", "/queues", KINDS["clusterqueues"].read, queues_router())
