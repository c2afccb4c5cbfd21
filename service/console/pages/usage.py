"""Usage: resource-hours (GPU-hours by default) by team, ClusterQueue, flavor
and cluster per period, as stacked bars drawn here as SVG and as tables with
a CSV download.

Every figure is a row of ``AuditService.usage`` — the API's ``GET /v1/usage``,
the ledger's ``UsageRollup`` — called once per grouping, exactly as ``qmctl
usage --by <group>`` asks for it; this page only filters those rows (period,
resource) and lays them out. The measures shown are whatever the rows carry
besides their period, group and resource (``held``, ``ran``, …).

The figures follow the ledger live: they are read anew when an event that
comes with a ledger entry arrives (:data:`~service.console.pages.ledger.LEDGER_EVENTS`),
any of them, as an open admission's hours are counted up to the ledger's
last entry.
"""

from __future__ import annotations

import asyncio
import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool as run

from service.app.audit import AUDITORS
from service.console.pages.ledger import LEDGER_EVENTS, Moment, moment
from service.console.web import CurrentViewer, Page, Services_, Viewer, render

Granularity = Literal["hour", "day", "month"]
#: The groupings charted, as ``qmctl usage --by`` names them, and their headings.
DIMENSIONS = (
    ("namespace", "Team"),
    ("cluster_queue", "ClusterQueue"),
    ("flavor", "Flavor"),
    ("cluster", "Cluster"),
)
GROUPS = tuple(name for name, _ in DIMENSIONS)
GPU = "nvidia.com/gpu"
#: Columns of a row that are not measures ("hours" is the API's older name of "held").
NOT_MEASURES = frozenset({"period", "resource", "hours", *GROUPS, "local_queue"})
#: Okabe-Ito colours, told apart with any colour vision; "others" are grey.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#000000")
OTHERS = "#8a8a8a"
LABELS = {"hour": "%m-%d %H:00", "day": "%m-%d", "month": "%Y-%m"}
Resource = Annotated[str, Query(max_length=253, pattern=r"^[a-z0-9]([-a-z0-9./]*[a-z0-9])?$")]
AsOf = Annotated[str | None, Query(alias="asOf", max_length=40)]
Measure = Annotated[str | None, Query(max_length=32)]


def unit(resource: str) -> str:
    return {GPU: "GPU-hours", "cpu": "core-hours", "memory": "GiB-hours"}.get(
        resource, "device-hours"
    )


@dataclass(frozen=True)
class Period:
    """Which rows to show: periods starting from ``since`` until before ``until``."""

    granularity: Granularity
    since: datetime | None
    until: datetime | None
    as_of: datetime | None
    resource: str

    def holds(self, row: dict[str, Any]) -> bool:
        start = datetime.fromisoformat(row["period"])
        return (
            row["resource"] == self.resource
            and (self.since is None or start >= self.since)
            and (self.until is None or start < self.until)
        )


def measures(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The measures the rollup's rows carry, in their order."""
    found: list[str] = []
    for row in rows[:1]:
        found = [k for k, v in row.items() if k not in NOT_MEASURES and _number(v)]
    return found or ["held"]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class Bar:
    period: str
    label: str
    x: float
    width: float
    segments: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Chart:
    """A stacked bar per period, a segment per group: laid out for the SVG."""

    dimension: str
    heading: str
    measure: str
    bars: list[Bar]
    legend: list[tuple[str, str]]
    ticks: list[tuple[float, str]]
    width: int = 720
    height: int = 260
    left: int = 64
    bottom: int = 40
    top_pad: int = 12

    @property
    def plot_height(self) -> int:
        return self.height - self.bottom - self.top_pad


def nice_top(peak: float) -> tuple[float, float]:
    """A round axis top at or above ``peak``, and its tick step: 1, 2 or 5
    times a power of ten."""
    if peak <= 0:
        return 1.0, 0.25
    raw = peak / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return step * math.ceil(peak / step - 1e-9), step


def chart(
    dimension: str, heading: str, rows: list[dict[str, Any]], measure: str, granularity: str
) -> Chart:
    """The stacked bars of ``rows`` (one grouping's) for ``measure``, a bar
    per period; the largest groups keep a colour of their own, the rest share
    one ("others")."""
    colour, order = _colours(rows, dimension, measure)
    stacks = _stacks(rows, dimension, measure, colour)
    top, step = nice_top(max((sum(s.values()) for s in stacks.values()), default=0.0))
    drawn = Chart(dimension, heading, measure, [], [], [])
    slot = (drawn.width - drawn.left - 8) / max(1, len(stacks))
    labelled = max(1, math.ceil(len(stacks) / 12))  # at most a dozen labels
    for i, (period, stack) in enumerate(sorted(stacks.items())):
        label = datetime.fromisoformat(period).strftime(LABELS[granularity])
        bar = Bar(
            period,
            label if i % labelled == 0 else "",
            drawn.left + i * slot + slot * 0.15,
            slot * 0.7,
        )
        bar.segments = _segments(stack, order, colour, top, drawn)
        drawn.bars.append(bar)
    count = round(top / step)
    drawn.ticks = [
        (drawn.top_pad + drawn.plot_height * (1 - k / count), f"{k * step:g}")
        for k in range(count + 1)
    ]
    drawn.legend = [(name, colour.get(name, OTHERS)) for name in order]
    return drawn


def _colours(
    rows: list[dict[str, Any]], dimension: str, measure: str
) -> tuple[dict[str, str], list[str]]:
    """A colour per group, largest first, and the order segments stack in."""
    totals: dict[str, float] = {}
    for row in rows:
        totals[row[dimension]] = totals.get(row[dimension], 0.0) + row[measure]
    ranked = sorted(totals, key=lambda g: (-totals[g], g))
    own = ranked if len(ranked) <= len(PALETTE) else ranked[: len(PALETTE) - 1]
    return {g: PALETTE[i] for i, g in enumerate(own)}, own + (["others"] if own != ranked else [])


def _stacks(
    rows: list[dict[str, Any]], dimension: str, measure: str, colour: dict[str, str]
) -> dict[str, dict[str, float]]:
    """Per period, the measure of each group that has a colour, and of the others."""
    stacks: dict[str, dict[str, float]] = {}
    for row in rows:
        name = row[dimension] if row[dimension] in colour else "others"
        stack = stacks.setdefault(row["period"], {})
        stack[name] = stack.get(name, 0.0) + row[measure]
    return stacks


def _segments(
    stack: dict[str, float], order: list[str], colour: dict[str, str], top: float, drawn: Chart
) -> list[dict[str, Any]]:
    """One bar's rectangles, the first group at the bottom, topmost listed first."""
    segments = []
    y = float(drawn.top_pad + drawn.plot_height)
    for name in order:
        value = stack.get(name, 0.0)
        if value > 0:
            h = drawn.plot_height * value / top
            y -= h
            fill = colour.get(name, OTHERS)
            segments.append({"group": name, "value": value, "y": y, "h": h, "fill": fill})
    return segments[::-1]


def _period(
    granularity: Granularity, since: str | None, until: str | None, as_of: str | None, resource: str
) -> Period:
    end = moment(until, "until")
    # A date alone is a whole day: "until 2026-11-30" keeps that day's periods.
    if end is not None and until is not None and len(until) == 10:
        end += timedelta(days=1)
    return Period(granularity, moment(since, "since"), end, moment(as_of, "asOf"), resource)


async def _usage(viewer: Viewer, services: Any, period: Period) -> dict[str, list[dict[str, Any]]]:
    """One rollup report per grouping, as ``qmctl usage --by <group>`` gets it."""
    reports = await asyncio.gather(
        *(
            run(services.audit.usage, viewer.principal, period.granularity, [g], period.as_of)
            for g in GROUPS
        )
    )
    return dict(zip(GROUPS, reports, strict=True))


Chosen = tuple[Granularity, str | None, str | None, str | None, str]
"""The form's granularity, since, until, as of and resource."""


def _chosen(
    granularity: Granularity = "day",
    since: Moment = None,
    until: Moment = None,
    as_of: AsOf = None,
    resource: Resource = GPU,
) -> Chosen:
    """What the page, its live body and the CSV are asked for, from the query string."""
    return (granularity, since, until, as_of, resource)


Chosen_ = Annotated[Chosen, Depends(_chosen)]


def usage_router() -> APIRouter:
    router = APIRouter()

    @router.get("/usage")
    async def usage(
        viewer: CurrentViewer, services: Services_, chosen: Chosen_, measure: Measure = None
    ) -> Response:
        context = await _report(viewer, services, chosen, measure)
        return render(viewer, "usage.html", {"title": "Usage", **context})

    @router.get("/usage/body")
    async def body(
        viewer: CurrentViewer, services: Services_, chosen: Chosen_, measure: Measure = None
    ) -> Response:
        """The charts and tables alone, which the page re-reads live."""
        context = await _report(viewer, services, chosen, measure)
        return render(viewer, "_usage_body.html", context)

    @router.get("/usage.csv")
    async def usage_csv(
        viewer: CurrentViewer,
        services: Services_,
        by: Annotated[Literal["namespace", "cluster_queue", "flavor", "cluster"], Query()],
        chosen: Chosen_,
    ) -> Response:
        """One grouping's rows as the rollup gives them, every number exact
        (the shortest digits that read back as the same float)."""
        granularity = chosen[0]
        period = _period(*chosen)
        rows = await run(services.audit.usage, viewer.principal, granularity, [by], period.as_of)
        shown = [r for r in rows if period.holds(r)]
        columns = measures(rows)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["period", by, "resource", *columns])
        for row in shown:
            writer.writerow(
                [row["period"], row[by], row["resource"], *(repr(row[c]) for c in columns)]
            )
        name = f"usage-{by}-{granularity}.csv"
        headers = {
            "Content-Disposition": f'attachment; filename="{name}"',
            "Cache-Control": "no-store",
        }
        return Response(out.getvalue(), media_type="text/csv", headers=headers)

    return router


async def _report(
    viewer: Viewer, services: Any, chosen: Chosen, measure: str | None
) -> dict[str, Any]:
    """What the page shows of the period ``chosen``, and the stream's start."""
    granularity, since, until, as_of, resource = chosen
    period = _period(granularity, since, until, as_of, resource)
    form = {
        "granularity": granularity,
        "since": since or "",
        "until": until or "",
        "asOf": as_of or "",
        "resource": resource,
    }
    # Read before the rollups: an entry they miss comes with an event after it.
    head = await run(services.event_queries.head)
    reports = await _usage(viewer, services, period)
    every = [row for rows in reports.values() for row in rows]
    shown = {g: [r for r in rows if period.holds(r)] for g, rows in reports.items()}
    columns = measures(every)
    wanted = measure if measure in columns else columns[0]
    sections = [
        {
            "dimension": dim,
            "heading": heading,
            "rows": shown[dim],
            "totals": _totals(shown[dim], dim, columns),
            "chart": chart(dim, heading, shown[dim], wanted, granularity),
        }
        for dim, heading in DIMENSIONS
    ]
    return {
        "sections": sections,
        "measures": columns,
        "measure": wanted,
        "unit": unit(resource),
        "resources": sorted({r["resource"] for r in every} | {resource}),
        "form": form,
        "query": "&".join(f"{k}={quote(v, safe='/')}" for k, v in form.items()),
        "head": head,
        "events": LEDGER_EVENTS,
    }


def _totals(rows: list[dict[str, Any]], dimension: str, columns: list[str]) -> list[dict[str, Any]]:
    """Each group's sum over the periods shown, largest first, then all of them."""
    sums: dict[str, dict[str, float]] = {}
    for row in rows:
        into = sums.setdefault(row[dimension], dict.fromkeys(columns, 0.0))
        for c in columns:
            into[c] += row[c]
    ranked = sorted(sums.items(), key=lambda kv: (-kv[1][columns[0]], kv[0]))
    return [{"group": g, **values} for g, values in ranked]


PAGE = Page("Usage", "/usage", AUDITORS, usage_router())
