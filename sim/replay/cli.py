"""``quartermaster sim replay``: replay a GPU job trace on a fleet, in virtual time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sim.fleet import load_fleet
from sim.replay.loop import ReplayOptions, Simulator, fifo_fleet, fifo_options
from sim.replay.trace import load_trace

__all__ = ["register"]

_BASELINES = ("fifo",)


def _run(simulator: Simulator, console: Console, title: str) -> dict[str, Any]:
    with Progress(
        TextColumn(f"[bold]{title}[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs done · day {task.fields[day]:.1f} · {task.fields[pending]} waiting"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task(title, total=len(simulator.jobs), day=0.0, pending=0)

        def progress(done: int, now: float) -> None:
            bar.update(task, completed=done, day=now / 86400.0, pending=len(simulator.pending))

        return simulator.run(progress)


def replay(
    trace: Annotated[
        Path,
        typer.Option(
            help="CSV: job_id,submission_time,duration,num_gpu[,team][,priority].",
            exists=True,
            dir_okay=False,
        ),
    ],
    fleet: Annotated[
        Path, typer.Option(help="Fleet file (see sim/fleet.py).", exists=True, dir_okay=False)
    ],
    out: Annotated[Path, typer.Option(help="Where to write RESULT (JSON).")],
    baseline: Annotated[
        str | None, typer.Option(help="Also replay on a baseline scheduler: fifo.")
    ] = None,
    cycle_interval: Annotated[
        float, typer.Option(help="Virtual seconds between admission cycles, at most.")
    ] = 60.0,
    gpus_per_pod: Annotated[
        int, typer.Option(help="GPUs per pod; bigger jobs are gangs of such pods.")
    ] = 8,
    limit: Annotated[
        int | None, typer.Option(help="Replay only the first N jobs of the trace.")
    ] = None,
) -> None:
    """Replay a job trace through the admission engine (no database) and write RESULT."""
    if baseline is not None and baseline not in _BASELINES:
        raise typer.BadParameter(f"unknown baseline {baseline!r}", param_hint="--baseline")
    console = Console(stderr=True)
    jobs = load_trace(trace, limit)
    the_fleet = load_fleet(fleet)
    options = ReplayOptions(cycle_interval=cycle_interval, gpus_per_pod=gpus_per_pod)
    result: dict[str, Any] = {
        "trace": str(trace),
        "fleet": str(fleet),
        "cycle_interval_s": cycle_interval,
        "gpus_per_pod": gpus_per_pod,
    }
    result.update(_run(Simulator(the_fleet, jobs, options), console, "quartermaster"))
    if baseline == "fifo":
        simulator = Simulator(fifo_fleet(the_fleet), jobs, fifo_options(options))
        result["baseline"] = _run(simulator, console, "fifo baseline")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    console.print(f"RESULT written to {out}")
    summary = {
        k: result[k]
        for k in (
            "jobs",
            "completed",
            "mean_wait_s",
            "p95_wait_s",
            "gpu_utilization",
            "jain_fairness",
            "island_violations",
        )
    }
    console.print(json.dumps(summary))


def register(app: typer.Typer) -> None:
    """Add ``replay`` to the ``quartermaster sim`` command group."""
    app.command("replay")(replay)
