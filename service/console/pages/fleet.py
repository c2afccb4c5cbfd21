"""Fleet: member clusters with health, heartbeat, lease and version, and
each cluster's fabric islands as tiles coloured by GPUs used and free per
flavor, with the gangs on each (``service.app.overview.fleet``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool as run

from service.app import overview
from service.app.kinds import KINDS
from service.console.pages.workloads import WORKLOAD_EVENTS
from service.console.web import CurrentViewer, Page, Services_, Settings_, Viewer, render

CLUSTER_EVENTS = ("ClusterSynced", "ClusterLost", "ResourceChanged", "ResourceDeleted")
#: Island tiles change with admissions and releases; cluster rows with heartbeats.
EVENTS = (*CLUSTER_EVENTS, *WORKLOAD_EVENTS)


def _fleet(viewer: Viewer, services: Any, lease: float) -> dict[str, Any]:
    head = services.event_queries.head()
    clusters = overview.fleet(services.engine, viewer.principal, timedelta(seconds=lease))
    return {"clusters": clusters, "head": head, "events": EVENTS}


def fleet_router() -> APIRouter:
    router = APIRouter()

    @router.get("/fleet")
    async def fleet(viewer: CurrentViewer, services: Services_, settings: Settings_) -> Response:
        found = await run(_fleet, viewer, services, settings.cluster_lease)
        return render(viewer, "fleet.html", {"title": "Fleet", **found})

    @router.get("/fleet/grid")
    async def grid(viewer: CurrentViewer, services: Services_, settings: Settings_) -> Response:
        found = await run(_fleet, viewer, services, settings.cluster_lease)
        return render(viewer, "_fleet_grid.html", found)

    return router


PAGE = Page("Fleet", "/fleet", KINDS["clusters"].read, fleet_router())
