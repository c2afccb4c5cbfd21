"""``quartermaster sim replay``: replay a GPU job trace on a fleet, in virtual time."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperOption

from service.engine import EngineConfig
from sim.fleet import Fleet, load_fleet
from sim.replay.baseline import best_fit_cycle
from sim.replay.loop import (
    ReplayOptions,
    Simulator,
    fifo_fleet,
    fifo_options,
    single_queue_fleet,
)
from sim.replay.options import (
    EngineOptions,
    parse_budget,
    parse_resource_weights,
    parse_spread_packing,
    parse_strategies,
)
from sim.replay.trace import TraceJob, load_trace

__all__ = ["register"]

#: ``--baseline`` names: the engine on one StrictFIFO queue with every team's
#: quota; the best-fit reference policy (:mod:`sim.replay.baseline`); the engine
#: configured like it, on one BestEffortFIFO queue without quotas.
_BASELINES = ("fifo", "best-fit", "single-queue")
_ENGINE = EngineOptions()


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


def _at_least(bound: float, *, open_: bool = False) -> Callable[[float | None], float | None]:
    """A typer callback refusing values below ``bound`` (or equal to it, if ``open_``)."""

    def check(value: float | None) -> float | None:
        if value is None:
            return value
        if not math.isfinite(value) or value < bound or (open_ and value == bound):
            word = "greater than" if open_ else "at least"
            raise typer.BadParameter(f"{value:g}: must be a finite number {word} {bound:g}")
        return value

    return check


def _strategies(value: str) -> str:
    try:
        parse_strategies(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def _spread(value: str) -> str:
    try:
        parse_spread_packing(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def _budget(value: str | None) -> str | None:
    if value is not None:
        try:
            parse_budget(value)
        except ValueError as error:
            raise typer.BadParameter(str(error)) from None
    return value


def _weights(value: list[str]) -> list[str]:
    try:
        parse_resource_weights(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def _baseline(value: list[str]) -> list[str]:
    for name in value:
        if name not in _BASELINES:
            known = ", ".join(_BASELINES)
            raise typer.BadParameter(f"unknown baseline {name!r}; the baselines are {known}")
        if value.count(name) > 1:
            raise typer.BadParameter(f"{name} is given twice")
    return value


def _command(ctx: typer.Context) -> str:
    """The command line that makes this run again: every option that is not its default."""
    words = [ctx.command_path]
    for param in ctx.command.params:
        if not isinstance(param, TyperOption) or param.name is None:
            continue
        value = ctx.params.get(param.name)
        if value is None or value in (param.default, (), []):
            continue
        if param.is_flag:
            words.append(param.opts[0] if value else param.secondary_opts[0])
            continue
        for item in value if isinstance(value, list | tuple) else (value,):
            words += [param.opts[0], str(item)]
    return " ".join(words)


def replay(
    ctx: typer.Context,
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
        list[str],
        typer.Option(
            help="Also replay on a baseline, repeatable: fifo (one StrictFIFO queue with "
            "every quota), best-fit (island-first best fit, no quotas, FIFO with backfill), "
            "single-queue (the engine on one BestEffortFIFO queue without quotas).",
            callback=_baseline,
        ),
    ] = [],  # noqa: B006 - typer reads the default; it is never mutated
    cycle_interval: Annotated[
        float,
        typer.Option(
            help="Virtual seconds between admission cycles, at most (0: at every event).",
            callback=_at_least(0.0),
        ),
    ] = 60.0,
    gpus_per_pod: Annotated[
        int,
        typer.Option(help="GPUs per pod; bigger jobs are gangs of such pods.", min=1),
    ] = 8,
    limit: Annotated[
        int | None, typer.Option(help="Replay only the first N jobs of the trace.", min=1)
    ] = None,
    fair_sharing: Annotated[
        bool,
        typer.Option(help="Kueue's fair sharing: DRS ordering and fair-sharing preemption."),
    ] = _ENGINE.fair_sharing,
    fair_sharing_strategies: Annotated[
        str,
        typer.Option(
            help="Fair-sharing preemption strategies, in order, comma-separated: "
            "LessThanOrEqualToFinalShare, LessThanInitialShare.",
            callback=_strategies,
        ),
    ] = ",".join(_ENGINE.strategies),
    prioritize_non_borrowing: Annotated[
        bool,
        typer.Option(help="Fair sharing: a nominee that would not borrow goes first."),
    ] = _ENGINE.prioritize_non_borrowing,
    admission_fair_sharing: Annotated[
        bool,
        typer.Option(help="Order each queue's heads by decayed usage (Kueue KEP-4136)."),
    ] = _ENGINE.admission_fair_sharing,
    afs_half_life: Annotated[
        float,
        typer.Option(
            help="Admission fair sharing: half-life of the usage, seconds (> 0).",
            callback=_at_least(0.0, open_=True),
        ),
    ] = _ENGINE.half_life_s,
    afs_sampling_interval: Annotated[
        float,
        typer.Option(
            help="Admission fair sharing: seconds between usage samples (> 0).",
            callback=_at_least(0.0, open_=True),
        ),
    ] = _ENGINE.sampling_interval_s,
    afs_resource_weight: Annotated[
        list[str],
        typer.Option(
            help="Admission fair sharing: RESOURCE=WEIGHT, repeatable (default: every 1).",
            callback=_weights,
        ),
    ] = [],  # noqa: B006 - typer reads the default; it is never mutated
    max_heads_per_cluster_queue: Annotated[
        int | None,
        typer.Option(help="Admit at most N heads per ClusterQueue a cycle (Kueue: 1).", min=1),
    ] = None,
    spread_packing: Annotated[
        str,
        typer.Option(
            help="Where a pod set that may spread goes: IslandFirst (the fullest island "
            "that holds it) or ClusterFirst (the fullest nodes of the fullest cluster; before).",
            callback=_spread,
        ),
    ] = _ENGINE.spread_packing,
    checkpoint_interval: Annotated[
        float | None,
        typer.Option(
            help="Jobs save a checkpoint every S seconds of their run on average (each "
            "its own seeded interval, S/2 to 3S/2); a preempted job restarts from it. "
            "Default: no job saves, everything since admission is lost.",
            min=0.0,
        ),
    ] = None,
    checkpoint_seed: Annotated[int, typer.Option(help="Seeds the jobs' checkpoint intervals.")] = 0,
    consolidation: Annotated[
        bool,
        typer.Option(
            help="Consolidation: a gang blocked only by fragmentation may preempt "
            "lower-priority (or over-share) gangs inside one island "
            "(service/engine/consolidation.py)."
        ),
    ] = _ENGINE.consolidation,
    consolidation_any_victim_placement: Annotated[
        bool,
        typer.Option(
            help="Consolidation without checking that its victims fit again elsewhere at once."
        ),
    ] = False,
    reservation: Annotated[
        bool,
        typer.Option(
            help="Head-of-line reservation: the island closest to fitting the island gang "
            "that has waited longest takes no backfill (service/engine/reservation.py)."
        ),
    ] = _ENGINE.reservation,
    reservation_min_accelerators: Annotated[
        int,
        typer.Option(help="Reserve only for gangs of at least this many GPUs.", min=1),
    ] = _ENGINE.reservation_min_accelerators,
    reservation_min_wait: Annotated[
        float,
        typer.Option(help="Reserve only for gangs submitted at least S seconds ago.", min=0.0),
    ] = _ENGINE.reservation_min_wait_s,
    spare_island_gangs: Annotated[
        bool,
        typer.Option(
            help="Preemption victims: a gang that must restart whole in one island and is "
            "bigger than its preemptor goes after every other candidate of its priority."
        ),
    ] = _ENGINE.spare_island_gangs,
    island_gang_grace: Annotated[
        int | None,
        typer.Option(
            help="Set preemption.protection.islandGangGraceSeconds on every ClusterQueue: "
            "a gang that must run whole in one island is no victim of a smaller preemptor "
            "of another ClusterQueue until that preemptor has been queued S seconds.",
            min=0,
        ),
    ] = None,
    team_seed: Annotated[
        int,
        typer.Option(
            help="Assign jobs without a team by a hash salted with N (0: the trace's "
            "stable assignment, sim/replay/trace.py).",
            min=0,
        ),
    ] = 0,
    min_runtime: Annotated[
        int | None,
        typer.Option(
            help="Set preemption.protection.minRuntimeSeconds on every ClusterQueue of the fleet.",
            min=0,
        ),
    ] = None,
    preemption_budget: Annotated[
        str | None,
        typer.Option(
            help="Set preemption.budget on every ClusterQueue of the fleet: N/SECONDS, a "
            "token bucket of N refilled at N per SECONDS.",
            callback=_budget,
        ),
    ] = None,
) -> None:
    """Replay a job trace through the admission engine (no database) and write RESULT."""
    engine = EngineOptions(
        fair_sharing=fair_sharing,
        strategies=parse_strategies(fair_sharing_strategies),
        prioritize_non_borrowing=prioritize_non_borrowing,
        admission_fair_sharing=admission_fair_sharing,
        half_life_s=afs_half_life,
        sampling_interval_s=afs_sampling_interval,
        resource_weights=parse_resource_weights(afs_resource_weight),
        max_heads_per_cluster_queue=max_heads_per_cluster_queue,
        spread_packing=parse_spread_packing(spread_packing),
        consolidation=consolidation,
        consolidation_any_victim_placement=consolidation_any_victim_placement,
        reservation=reservation,
        reservation_min_accelerators=reservation_min_accelerators,
        reservation_min_wait_s=reservation_min_wait,
        spare_island_gangs=spare_island_gangs,
    )
    options = ReplayOptions(
        cycle_interval=cycle_interval,
        gpus_per_pod=gpus_per_pod,
        engine=engine.engine_config(),
        checkpoint_interval=checkpoint_interval or None,
        checkpoint_seed=checkpoint_seed,
        team_seed=team_seed,
        min_runtime=min_runtime,
        island_gang_grace=island_gang_grace,
        preemption_budget=parse_budget(preemption_budget) if preemption_budget else None,
    )
    console = Console(stderr=True)
    jobs = load_trace(trace, limit)
    result: dict[str, Any] = {
        "command": _command(ctx),
        "trace": str(trace),
        "fleet": str(fleet),
        "cycle_interval_s": cycle_interval,
        "gpus_per_pod": gpus_per_pod,
        "checkpoint_interval_s": options.checkpoint_interval,
        "checkpoint_seed": checkpoint_seed,
        "team_seed": team_seed,
        "engine": _engine_record(options.engine),
    }
    result.update(_replays(load_fleet(fleet), jobs, options, baseline, console))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    console.print(f"RESULT written to {out}")
    console.print(json.dumps(_summary(result)))


def _engine_record(config: EngineConfig) -> dict[str, Any]:
    """The engine configuration the replay ran with, as JSON."""
    fair, afs = config.fair_sharing, config.admission_fair_sharing
    return {
        "fair_sharing": fair.enable,
        "fair_sharing_strategies": list(fair.preemption_strategies),
        "prioritize_non_borrowing": fair.prioritize_non_borrowing,
        "admission_fair_sharing": afs.enable,
        "afs_half_life_s": afs.usage_half_life_seconds,
        "afs_sampling_interval_s": afs.usage_sampling_interval_seconds,
        "afs_resource_weights": dict(afs.resource_weights),
        "max_heads_per_cluster_queue": config.max_heads_per_cluster_queue,
        "spread_packing": config.spread_packing,
        "consolidation": config.consolidation.enable,
        "consolidation_victim_placement": config.consolidation.victim_placement,
        "reservation": config.reservation.enable,
        "reservation_min_accelerators": config.reservation.min_accelerators,
        "reservation_min_wait_s": config.reservation.min_wait_seconds,
        "spare_island_gangs": config.spare_island_gangs,
    }


def _replays(
    fleet: Fleet,
    jobs: list[TraceJob],
    options: ReplayOptions,
    baselines: list[str],
    console: Console,
) -> dict[str, Any]:
    """The engine's replay; each baseline's under ``baselines`` (the first also as ``baseline``)."""
    result = _run(Simulator(fleet, jobs, options), console, "quartermaster")
    others = {
        name: _run(_baseline_simulator(name, fleet, jobs, options), console, f"{name} baseline")
        for name in baselines
    }
    if baselines:
        result["baseline"] = others[baselines[0]]
        result["baselines"] = others
    return result


def _baseline_simulator(
    name: str, fleet: Fleet, jobs: list[TraceJob], options: ReplayOptions
) -> Simulator:
    if name == "fifo":
        return Simulator(fifo_fleet(fleet), jobs, fifo_options(options))
    quota_free = single_queue_fleet(fleet)
    if name == "best-fit":
        return Simulator(quota_free, jobs, replace(options, label="best-fit"), best_fit_cycle)
    return Simulator(quota_free, jobs, replace(fifo_options(options), label="single-queue"))


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("jobs", "completed", "mean_wait_s", "p95_wait_s", "gpu_utilization", "jain_fairness")
    summary = {k: result[k] for k in keys}
    summary["wait_s"] = result["wait_s"]
    summary["delay_s"] = result["delay_s"]
    summary["island_violations"] = result["island_violations"]
    return summary


def register(app: typer.Typer) -> None:
    """Add ``replay`` to the ``quartermaster sim`` command group."""
    app.command("replay")(replay)
