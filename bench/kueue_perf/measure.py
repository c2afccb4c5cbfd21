"""A run's figures, by Kueue's definitions where Kueue has one.

* wall: from the generator's start to the last ``WorkloadFinished`` (Kueue:
  the minimalkueue process's wall time, which ends a few seconds after the
  recorder saw no workload pending or reserving);
* ClusterQueue usage (``runner/recorder/recorder.go``, ``checker``): per
  ClusterQueue class, the cpu held x time summed over its ClusterQueues, x
  100 / (the sum of their nominal quotas x the time monitored). Kueue reads
  the held cpu from ClusterQueue ``status.flavorsUsage`` (admitted
  workloads); ours is the ledger's allocations (``workload.admitted`` to the
  entry that released it), from the start to the last release;
* time to admission (recorder's ``TimeToAdmitMs``): from the Workload's
  creation to its last admission (an evicted one's counts again from its
  creation); ours from its ``WorkloadSubmitted`` event to its last
  ``WorkloadAdmitted``, and beside it from when the generator was due to
  create it (the API may accept it late);
* admissions/s, CPU seconds per process, reclaim latency, cluster-loss
  recovery: ours (Kueue publishes none of them for these configs).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.kueue_perf.checks import (
    ADMISSION_LABEL,
    WORKLOAD_LABEL,
    Check,
    check_finished_once,
    check_ledger,
    check_members_ran,
    check_quota,
    check_submitted,
    check_topology,
)
from bench.kueue_perf.configs import Arrival, arrivals
from bench.kueue_perf.run import Raw
from service.ledger.accounting import allocations


@dataclass
class Life:
    """One workload's events, as wall times."""

    arrival: Arrival
    due: float = 0.0
    answered: float = 0.0
    submitted: float | None = None
    admitted: list[tuple[float, str]] = field(default_factory=list)
    running: list[tuple[float, str]] = field(default_factory=list)
    finished: list[float] = field(default_factory=list)
    preempted: list[float] = field(default_factory=list)
    #: Finished, preempted, evicted: each releases its admission.
    released: list[float] = field(default_factory=list)
    #: Per admission that ran on a member, by its kubelet: when its last pod
    #: began running (the gang started), when its last pod ended, the cluster.
    runs: list[tuple[float, float, str]] = field(default_factory=list)


def _stats(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "mean": None, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 3)

    return {
        "n": len(ordered),
        "mean": round(statistics.fmean(ordered), 3),
        "p50": at(0.5),
        "p99": at(0.99),
        "max": round(ordered[-1], 3),
    }


def lives(raw: Raw) -> dict[str, Life]:
    out = {f"{a.namespace}/{a.name}": Life(a) for a in arrivals(raw.options.config)}
    for answer in raw.answers:
        life = out.get(f"{answer.namespace}/{answer.name}")
        if life is not None:
            life.due, life.answered = answer.due, answer.answered
    for kind, namespace, name, cluster, at in raw.events:
        life = out.get(f"{namespace}/{name}")
        if life is None:
            continue
        if kind == "WorkloadSubmitted" and life.submitted is None:
            life.submitted = at
        elif kind == "WorkloadAdmitted":
            life.admitted.append((at, cluster or ""))
        elif kind == "WorkloadRunning":
            life.running.append((at, cluster or ""))
        elif kind == "WorkloadFinished":
            life.finished.append(at)
        elif kind == "WorkloadPreempted":
            life.preempted.append(at)
        if kind in ("WorkloadFinished", "WorkloadPreempted", "WorkloadEvicted"):
            life.released.append(at)
    for (key, cluster, _), pods in _gangs(raw).items():
        life = out.get(key)
        if life is not None and len(pods) >= life.arrival.cls.pods:
            life.runs.append((max(s for s, _ in pods), max(e for _, e in pods), cluster))
    for cluster, namespace, name, created in raw.jobs:  # --stand-ins api: the job's run
        life = out.get(f"{namespace}/{name}")
        if life is not None:
            life.runs.append((created, created + life.arrival.cls.runtime_ms / 1000, cluster))
    for life in out.values():
        life.runs.sort()
    return out


def _gangs(raw: Raw) -> dict[tuple[str, str, str], list[tuple[float, float]]]:
    """The members' pod runs by (workload, cluster, admission): (start, end)."""
    gangs: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for cluster, records in raw.intervals.items():
        for r in records:
            labels = r.get("labels") or {}
            namespace, _, name = str(labels.get(WORKLOAD_LABEL, "")).partition(".")
            end = float("inf") if r.get("end") is None else float(r["end"])
            key = (f"{namespace}/{name}", cluster, str(labels.get(ADMISSION_LABEL, "")))
            gangs[key].append((float(r["start"]), end))
    return gangs


def per_class(all_lives: Iterable[Life]) -> dict[str, dict[str, Any]]:
    grouped: dict[str, list[Life]] = defaultdict(list)
    for life in all_lives:
        grouped[life.arrival.cls.name].append(life)
    out = {}
    for name, group in grouped.items():
        admitted = [x for x in group if x.admitted and x.submitted is not None]
        finished = [x for x in group if x.finished and x.admitted]
        ran = [x for x in finished if x.runs]
        out[name] = {
            "time_to_admission_s": _stats(
                [x.admitted[-1][0] - (x.submitted or 0) for x in admitted]
            ),
            "due_to_admission_s": _stats([x.admitted[-1][0] - x.due for x in admitted if x.due]),
            "admission_to_finish_s_mean": _stats(
                [x.finished[-1] - x.admitted[-1][0] for x in finished]
            )["mean"],
            # Where that time goes: the last admission to its pods running on
            # the member, and its pods' end to the centre's WorkloadFinished.
            "admission_to_pods_running_s_mean": _stats(
                [x.runs[-1][0] - x.admitted[-1][0] for x in ran]
            )["mean"],
            "pods_end_to_finished_s_mean": _stats([x.finished[-1] - x.runs[-1][1] for x in ran])[
                "mean"
            ],
            "preempted": sum(len(x.preempted) for x in group),
        }
    return dict(sorted(out.items()))


def usage(raw: Raw, wall_end: float) -> dict[str, Any]:
    """Kueue's ClusterQueue usage, from the ledger's allocations."""
    config = raw.options.config
    start_us = int(raw.start * 1e6)
    used = 0.0  # milli-cpu x seconds
    last_end = start_us
    for allocation, end in allocations(raw.entries):
        stop = end if end is not None else micros_now(wall_end)
        cpu = sum(a for _, r, a in allocation.reserved if r == "cpu")
        used += cpu * max(0, stop - allocation.start_us) / 1e6
        last_end = max(last_end, stop)
    elapsed = (last_end - start_us) / 1e6
    nominal = config.cluster_queues * config.nominal_milli
    work = (
        sum(c.count * c.cpu_milli * c.runtime_ms / 1000 for c in config.classes)
        * config.cluster_queues
    )
    return {
        "usage_pct": round(used * 100 / (nominal * elapsed), 2) if elapsed > 0 else None,
        "cpu_s_held": round(used / 1000, 1),
        "monitored_s": round(elapsed, 2),
        "useful_work_pct": round(work * 100 / (nominal * elapsed), 2) if elapsed > 0 else None,
        "says": (
            "usage = cpu held x time over every ClusterQueue x 100 / (sum of nominal quotas x "
            f"time monitored) = {used / 1000:.0f} cpu·s x 100 / ({nominal / 1000:g} cpu x "
            f"{elapsed:.1f} s); useful work = the config's cpu x runtime ({work / 1000:g} "
            "cpu·s) over the same"
        ),
    }


def micros_now(wall: float) -> int:
    return int(wall * 1e6)


def admissions(raw: Raw, wall: float) -> dict[str, Any]:
    times = sorted(at for kind, *_, at in raw.events if kind == "WorkloadAdmitted")
    if not times:
        return {"admissions": 0}
    windows = Counter(int((t - raw.start) // 10) for t in times)
    return {
        "admissions": len(times),
        "per_s_over_wall": round(len(times) / wall, 1),
        "per_s_first_to_last": round(len(times) / max(1e-9, times[-1] - times[0]), 1),
        "per_s_peak_10s": round(max(windows.values()) / 10, 1),
    }


def reclaim(raw: Raw, all_lives: Mapping[str, Life]) -> dict[str, Any]:
    """Per preemption reason: the preemptors' submission → start (every pod
    of the admission that followed the preemption running, by the member's
    kubelet), and the decision → start (the victims' jobs removed, its own
    dispatched and started)."""
    first: dict[tuple[str, str], float] = {}
    victims: Counter[str] = Counter()
    for entry in raw.entries:
        if entry.kind != "workload.preempted":
            continue
        reason, preemptor = str(entry.body["reason"]), str(entry.body["preemptor"])
        victims[reason] += 1
        at = entry.recorded_at.timestamp()
        first.setdefault((reason, preemptor), at)
    out: dict[str, Any] = {}
    for reason in sorted(victims):
        to_start, decision_to_start = [], []
        for (why, preemptor), decided in first.items():
            life = all_lives.get(preemptor)
            if why != reason or life is None or life.submitted is None:
                continue
            started = next((t for t, _, _ in life.runs if t >= decided - 0.5), None)
            if started is not None:
                to_start.append(started - life.submitted)
                decision_to_start.append(started - decided)
        out[reason] = {
            "victims": victims[reason],
            "preemptors": sum(1 for why, _ in first if why == reason),
            "submission_to_start_s": _stats(to_start),
            "decision_to_start_s": _stats(decision_to_start),
        }
    return out


def recovery(raw: Raw, all_lives: Mapping[str, Life]) -> dict[str, Any] | None:
    """The killed member: when the centre marked it Lost, and when the gangs
    stranded there (held at the kill, or admitted there after it) ran
    elsewhere."""
    kill = raw.kill
    if kill is None:
        return None
    lost = next(
        (
            at
            for kind, _, name, _, at in raw.events
            if kind == "ClusterLost" and name == kill.member
        ),
        None,
    )
    stranded = {k for k, life in all_lives.items() if _held_at(life, kill.at, kill.member)}
    at_kill = set(stranded)
    for key, life in all_lives.items():
        if any(at > kill.at and c == kill.member for at, c in life.admitted):
            stranded.add(key)

    def elsewhere(life: Life) -> float | None:
        return next((t for t, _, c in life.runs if t > kill.at and c != kill.member), None)

    def done_there(life: Life) -> bool:
        """Its run there had ended before the kill (the centre learned late)."""
        return any(c == kill.member and e <= kill.at for _, e, c in life.runs)

    def admitted_elsewhere(life: Life) -> float | None:
        return next((t for t, c in life.admitted if t > kill.at and c != kill.member), None)

    held = [elsewhere(all_lives[k]) for k in at_kill]
    readmitted = [admitted_elsewhere(all_lives[k]) for k in at_kill]
    every = {k: elsewhere(all_lives[k]) for k in stranded}
    return {
        "member": kill.member,
        "killed_at_s": round(kill.at - raw.start, 1),
        "lease_s": float(raw.options.env.get("QM_CLUSTER_LEASE") or 60),
        "lost_after_s": None if lost is None else round(lost - kill.at, 1),
        "gangs_held_at_kill": len(at_kill),
        "gangs_held_at_kill_by_read_model": len(kill.holding),
        "gangs_admitted_there_after_kill": len(stranded - at_kill),
        "held_by_class": dict(Counter(all_lives[k].arrival.cls.name for k in sorted(at_kill))),
        # Lost (and requeued) → admitted again: their turn in the queue, behind
        # what waits at their priority since before they were requeued.
        "held_admitted_elsewhere_after_s": _stats(
            [t - kill.at for t in readmitted if t is not None]
        ),
        "held_running_elsewhere_after_s": _stats([t - kill.at for t in held if t is not None]),
        "all_stranded_running_elsewhere_after_s": _stats(
            [t - kill.at for t in every.values() if t is not None]
        ),
        "ran_there_before_the_kill": sum(
            1 for k, t in every.items() if t is None and done_there(all_lives[k])
        ),
        "never_ran_elsewhere": sum(
            1 for k, t in every.items() if t is None and not done_there(all_lives[k])
        ),
    }


def _held_at(life: Life, moment: float, cluster: str) -> bool:
    """Whether its last admission before ``moment`` was to ``cluster`` and
    nothing released it before then."""
    before = [(at, c) for at, c in life.admitted if at <= moment]
    if not before or before[-1][1] != cluster:
        return False
    return not any(before[-1][0] < at <= moment for at in life.released)


def check_jobs_ran(all_lives: Iterable[Life]) -> Check:
    """``--stand-ins api``: every workload's job appeared on a member, and
    the centre finished it no sooner than its runtime after its last job
    appeared (nothing finished before it could have run)."""
    problems = []
    for life in all_lives:
        key = f"{life.arrival.namespace}/{life.arrival.name}"
        runtime = life.arrival.cls.runtime_ms / 1000
        if not life.runs:
            problems.append(f"{key}: no job on any member")
        elif life.finished and life.finished[-1] < life.runs[-1][0] + runtime - 0.01:
            problems.append(
                f"{key}: finished {life.finished[-1] - life.runs[-1][0]:.3f} s after its job "
                f"appeared, its runtime is {runtime:g} s"
            )
    return Check(
        "every workload's job ran its runtime on a member",
        problems,
        {"jobs": sum(len(x.runs) for x in all_lives)},
    )


def cpu_seconds(raw: Raw) -> dict[str, float]:
    out = {
        name: round(after - raw.cpu_before.get(name, 0.0), 1)
        for name, after in sorted(raw.cpu_after.items())
    }
    for name in raw.box_after:
        out[name] = round(raw.box_after[name] - raw.box_before.get(name, 0.0), 1)
    return out


def figures(raw: Raw) -> dict[str, Any]:
    config = raw.options.config
    all_lives = lives(raw)
    finishes = [t for life in all_lives.values() for t in life.finished]
    last_finish = max(finishes, default=raw.ended)
    wall = last_finish - raw.start
    late = [a.answered - a.due for a in raw.answers]
    statuses = {f"{a.namespace}/{a.name}": a.status for a in raw.answers}
    finished_events = Counter(
        f"{ns}/{n}" for kind, ns, n, _, _ in raw.events if kind == "WorkloadFinished"
    )
    ran = (
        check_members_ran(config, raw.intervals)
        if raw.options.stand_ins == "controllers"
        else check_jobs_ran(all_lives.values())
    )
    checks = [
        check_submitted(config, statuses, raw.entries),
        check_finished_once(config, finished_events, raw.entries),
        check_quota(config, raw.entries),
        ran,
        check_ledger(raw.ledger_problems, raw.entries),
    ]
    if config.topology is not None:
        checks.append(check_topology(config, raw.placements, raw.racks))
    return {
        "wall_s": round(wall, 2),
        "finished_in_time": raw.finished_in_time,
        "usage": usage(raw, last_finish),
        "classes": per_class(all_lives.values()),
        "admissions": admissions(raw, wall),
        "submission": {
            "statuses": raw.statuses,
            "retried": sum(a.attempts - 1 for a in raw.answers),
            "late_s": _stats(late),
            "last_acknowledged_s": round(
                max((a.answered for a in raw.answers), default=0) - raw.start, 2
            ),
        },
        "reclaim": reclaim(raw, all_lives),
        "cluster_loss": recovery(raw, all_lives),
        "cpu_seconds": cpu_seconds(raw),
        "states_at_end": raw.states,
        "bench_kubelet": raw.completions or None,
        "checks": [c.to_json() for c in checks],
        "ok": all(c.ok for c in checks) and raw.finished_in_time,
    }
