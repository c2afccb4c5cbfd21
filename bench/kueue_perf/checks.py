"""What a run must show, checked from the ledger, the events and the members.

* every workload of the config submitted (201) and in the ledger once;
* every one finished exactly once — one ``WorkloadFinished`` event, one
  ``workload.finished`` entry, succeeded — and nothing else finished;
* no quota ever exceeded: the ledger's allocations swept in ``seq`` order
  (the order the admissions committed in), each ClusterQueue's cpu held
  never above nominal + borrowingLimit, each cohort's never above its
  queues' nominal sum (no lending limits: Kueue's flat cohort); and no
  admission of a gang that still held one;
* the stand-ins' kubelets ran every workload's pods for its runtime, under
  one admission at least, and no node ever ran more cpu than it has;
* the ledger verifies and matches the events (tests/workers/invariants.py).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from bench.kueue_perf.configs import Arrival, Config, arrivals, cq_name
from bench.kueue_perf.manifests import NODE_CPU
from service.ledger.accounting import RELEASING
from service.ledger.chain import LedgerEntry
from service.ledger.postgres import PostgresLedgerReader
from tests.workers.invariants import ledger_matches_events

WORKLOAD_LABEL = "quartermaster.dev/workload"
ADMISSION_LABEL = "quartermaster.dev/admission"


@dataclass
class Check:
    name: str
    problems: list[str]
    counts: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "ok": self.ok,
            "problems": len(self.problems),
            "examples": self.problems[:10],
            **self.counts,
        }


def ledger_sound(db: sa.Engine) -> tuple[list[LedgerEntry], list[str]]:
    """Every ledger entry, and what is wrong with the chain or between the
    ledger and the events."""
    reader = PostgresLedgerReader(db)
    verification = reader.verify()
    problems = [f"seq {b.seq}: {b.reason}" for b in verification.breaks]
    mismatches, _ = ledger_matches_events(db)
    return list(reader.entries()), problems + mismatches


def _key(body: Mapping[str, Any]) -> str:
    return f"{body.get('namespace')}/{body.get('workload')}"


def check_submitted(
    config: Config, statuses: Mapping[str, int], entries: Sequence[LedgerEntry]
) -> Check:
    """Each workload answered 201 and submitted once in the ledger."""
    wanted = {f"{a.namespace}/{a.name}" for a in arrivals(config)}
    answered = {k for k, s in statuses.items() if s == 201}
    submitted = Counter(_key(e.body) for e in entries if e.kind == "workload.submitted")
    problems = [f"{k}: answered {statuses.get(k, 'nothing')}" for k in sorted(wanted - answered)]
    problems += [f"{k}: submitted {n} times" for k, n in sorted(submitted.items()) if n != 1]
    problems += [f"{k}: in the ledger, not generated" for k in sorted(set(submitted) - wanted)]
    problems += [f"{k}: generated, not in the ledger" for k in sorted(wanted - set(submitted))]
    return Check(
        "every workload submitted once",
        problems,
        {
            "generated": len(wanted),
            "acknowledged": len(answered & wanted),
            "in_ledger": len(submitted),
        },
    )


def check_finished_once(
    config: Config, finished_events: Counter[str], entries: Sequence[LedgerEntry]
) -> Check:
    wanted = {f"{a.namespace}/{a.name}" for a in arrivals(config)}
    finished = [e.body for e in entries if e.kind == "workload.finished"]
    in_ledger = Counter(_key(b) for b in finished)
    problems = [
        f"{k}: {finished_events[k]} WorkloadFinished events, {in_ledger[k]} workload.finished"
        for k in sorted(wanted | set(in_ledger) | set(finished_events))
        if finished_events[k] != 1 or in_ledger[k] != 1
    ]
    problems += [
        f"{_key(b)}: finished {b.get('outcome')}"
        for b in finished
        if b.get("outcome") != "succeeded"
    ]
    return Check(
        "every workload finished exactly once",
        problems,
        {"workloads": len(wanted), "finished": sum(1 for k in wanted if in_ledger[k] == 1)},
    )


def check_quota(config: Config, entries: Iterable[LedgerEntry]) -> Check:
    """The ledger's allocations in commit order against the quota tree."""
    limit_cq = config.nominal_milli + config.borrowing_limit_milli
    limit_cohort = config.queues * config.nominal_milli
    cohort_of = {
        cq_name(q, c): f"cohort-{c}" for c in range(config.cohorts) for q in range(config.queues)
    }
    open_: dict[str, tuple[str, str, int]] = {}  # key -> (cq, cluster, cpu milli)
    cq_use: Counter[str] = Counter()
    cohort_use: Counter[str] = Counter()
    peak_cq: Counter[str] = Counter()
    peak_cohort: Counter[str] = Counter()
    problems: list[str] = []
    admissions = 0

    def release(key: str) -> None:
        held = open_.pop(key, None)
        if held is not None:
            cq_use[held[0]] -= held[2]
            cohort_use[cohort_of.get(held[0], "?")] -= held[2]

    for entry in entries:
        body = entry.body
        if entry.kind == "workload.admitted":
            admissions += 1
            key, cq = _key(body), str(body["cluster_queue"])
            if key in open_:
                problems.append(f"seq {entry.seq}: {key} admitted while holding an admission")
                release(key)
            cpu = sum(int(a.get("cpu", 0)) for a in (body.get("reserved") or {}).values())
            open_[key] = (cq, str(body["cluster"]), cpu)
            cq_use[cq] += cpu
            cohort = cohort_of.get(cq, "?")
            cohort_use[cohort] += cpu
            peak_cq[cq] = max(peak_cq[cq], cq_use[cq])
            peak_cohort[cohort] = max(peak_cohort[cohort], cohort_use[cohort])
            if cq_use[cq] > limit_cq:
                problems.append(f"seq {entry.seq}: {cq} holds {cq_use[cq]}m cpu > {limit_cq}m")
            if cohort_use[cohort] > limit_cohort:
                problems.append(
                    f"seq {entry.seq}: {cohort} holds {cohort_use[cohort]}m cpu > {limit_cohort}m"
                )
        elif entry.kind in RELEASING:
            release(_key(body))
        elif entry.kind == "cluster.lost":
            for key in [k for k, v in open_.items() if v[1] == body.get("cluster")]:
                release(key)
    return Check(
        "no quota ever exceeded (ledger, commit order)",
        problems,
        {
            "admissions": admissions,
            "cq_limit_cpu": limit_cq / 1000,
            "peak_cq_cpu": max(peak_cq.values(), default=0) / 1000,
            "cohort_limit_cpu": limit_cohort / 1000,
            "peak_cohort_cpu": max(peak_cohort.values(), default=0) / 1000,
            "open_at_end": len(open_),
        },
    )


def check_members_ran(config: Config, intervals: Mapping[str, list[dict[str, Any]]]) -> Check:
    """Every workload's pods ran their runtime on a member (all of them
    under one admission), and no node ran more cpu than it has. A killed
    member's records are those read just before the kill."""
    by_key: dict[str, Arrival] = {f"{a.namespace}/{a.name}": a for a in arrivals(config)}
    complete: dict[str, Counter[str]] = defaultdict(Counter)
    node_events: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for cluster, records in intervals.items():
        for r in records:
            labels = r.get("labels") or {}
            namespace, _, name = str(labels.get(WORKLOAD_LABEL, "")).partition(".")
            arrival = by_key.get(f"{namespace}/{name}")
            if arrival is None or r.get("end") is None:
                continue
            cpu = arrival.cls.request_milli
            node_events[(cluster, r["node"])] += [(r["start"], cpu), (r["end"], -cpu)]
            if r["end"] - r["start"] >= arrival.cls.runtime_ms / 1000 * 0.99:
                complete[f"{namespace}/{name}"][str(labels.get(ADMISSION_LABEL, ""))] += 1
    problems = [
        f"{key}: no admission under which all {a.cls.pods} pods ran {a.cls.runtime_ms} ms"
        for key, a in sorted(by_key.items())
        if max(complete[key].values(), default=0) < a.cls.pods
    ]
    peak = 0
    for (cluster, node), points in node_events.items():
        used = 0
        for _, delta in sorted(points, key=lambda p: (p[0], p[1])):  # ends before starts
            used += delta
            peak = max(peak, used)
            if used > NODE_CPU * 1000:
                problems.append(f"{cluster}/{node}: {used}m cpu running at once")
                break
    runs = sum(len(r) for r in intervals.values())
    return Check(
        "the members ran every workload its runtime, within each node",
        problems,
        {"pod_runs": runs, "peak_node_cpu": peak / 1000},
    )


def check_topology(
    config: Config, placements: Sequence[tuple[str, str, list[list[str]]]], racks: Mapping[str, str]
) -> Check:
    """TAS: every admission of a ``required`` (and ``balanced``, submitted as
    required) pod set on nodes of one rack; how many ``preferred`` ones did."""
    classes = {f"{a.namespace}/{a.name}": a.cls for a in arrivals(config)}
    problems: list[str] = []
    preferred = in_one = 0
    for namespace, name, pod_sets in placements:
        cls = classes.get(f"{namespace}/{name}")
        if cls is None or cls.tas is None:
            continue
        for nodes in pod_sets:
            spread = {racks.get(n, "?") for n in nodes}
            if cls.tas == "preferred":
                preferred += 1
                in_one += len(spread) == 1
            elif len(spread) != 1:
                problems.append(f"{namespace}/{name} ({cls.tas}): pods in racks {sorted(spread)}")
    return Check(
        "TAS: required (and balanced) pod sets in one rack",
        problems,
        {
            "admissions": len(placements),
            "preferred_pod_sets": preferred,
            "preferred_in_one_rack": in_one,
        },
    )


def check_ledger(problems: list[str], entries: Sequence[LedgerEntry]) -> Check:
    return Check(
        "the ledger verifies and matches the events",
        problems,
        {"entries": len(entries)},
    )
