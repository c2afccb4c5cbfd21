"""``qmctl usage``: resource-hours per team and queue, from the ledger."""

from __future__ import annotations

from typing import Annotated

import typer

from quartermaster_client.cli.render import table, to_json, to_yaml
from quartermaster_client.cli.shared import STATE, examples, handled
from quartermaster_client.models import UsageRow

commands = typer.Typer()


@commands.command(
    epilog=examples(
        "qmctl usage                                   # GPU-hours per namespace and day",
        "qmctl usage --by cluster_queue --granularity month --chart",
        "qmctl usage --by namespace --by flavor --resource all -o json",
    )
)
@handled
def usage(
    by: Annotated[
        list[str] | None,
        typer.Option(
            "--by", help="namespace, local_queue, cluster_queue, cluster, flavor; repeatable."
        ),
    ] = None,
    granularity: Annotated[str, typer.Option("--granularity", help="hour, day, month.")] = "day",
    resource: Annotated[
        str, typer.Option("--resource", help="nvidia.com/gpu, cpu, memory ... or all.")
    ] = "nvidia.com/gpu",
    as_of: Annotated[str | None, typer.Option("--as-of", help="ISO 8601 time.")] = None,
    chart: Annotated[bool, typer.Option("--chart", help="Bars of the total per group.")] = False,
    output: Annotated[str, typer.Option("-o", "--output", help="table, json or yaml.")] = "table",
) -> None:
    """Resource-hours per team and queue from the ledger, as a table or a chart:
    HOURS what the admissions held (quota and fair sharing count this), RAN
    what their pods ran by the members' own timestamps."""
    groups = by or ["namespace"]
    with STATE.client() as client:
        rows = client.usage(granularity, groups, as_of)
    rows = [r for r in rows if resource in ("all", r.resource)]
    if output in ("json", "yaml"):
        data = [r.to_dict() for r in rows]
        typer.echo(to_json(data) if output == "json" else to_yaml({"items": data}))
        return
    if not rows:
        what = "" if resource == "all" else f"{resource} "
        typer.echo(f"No {what}usage recorded yet.", err=True)
        return
    if chart:
        typer.echo(_chart(rows, groups))
        return
    header = ["PERIOD", *(g.upper() for g in groups), "RESOURCE", "HOURS", "RAN"]
    body = [
        [
            r.period[:16].replace("T", " "),
            *(str(r.group().get(g, "-")) for g in groups),
            r.resource,
            f"{r.hours:,.2f}",
            "-" if r.ran is None else f"{r.ran:,.2f}",
        ]
        for r in rows
    ]
    typer.echo(table(header, body))


def _chart(rows: list[UsageRow], groups: list[str]) -> str:
    totals: dict[str, float] = {}
    for row in rows:
        key = "/".join(str(row.group().get(g, "-")) for g in groups) + f" {row.resource}"
        totals[key] = totals.get(key, 0.0) + row.hours
    width, top = 40, max(totals.values()) or 1.0
    label = max(len(k) for k in totals)
    return "\n".join(
        f"{key.ljust(label)}  {'█' * max(1, round(width * hours / top)):<{width}}  {hours:,.2f} h"
        for key, hours in sorted(totals.items(), key=lambda kv: -kv[1])
    )
