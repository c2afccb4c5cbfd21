"""The evidence a run collects and the checks over it (see the package's
docstring for what each check says)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.ledger.accounting import RELEASING, Holding, audit, double_closes
from service.ledger.chain import LedgerEntry
from service.ledger.postgres import PostgresLedgerReader
from tests.workers.chaos.centre import Centre
from tests.workers.chaos.config import ADMISSION_LABEL, WORKLOAD_LABEL
from tests.workers.chaos.load import Load
from tests.workers.chaos.members import Member
from tests.workers.invariants import ledger_matches_events
from tests.workers.stack import GPU


@dataclass(frozen=True)
class PodRun:
    """One pod's running interval on a member."""

    cluster: str
    gang: str  # namespace/name
    admission: str
    uid: str
    start: float
    end: float  # inf while it runs


@dataclass
class Evidence:
    acknowledged: set[str]
    attempted: set[str]
    entries: list[LedgerEntry]
    states: dict[str, tuple[str, str | None]]
    runs: list[PodRun]
    #: What the live members run now, by gang: (cluster, GPUs).
    running: dict[str, Holding]
    #: Jobs of ours still on live members.
    leftover_jobs: list[str]
    #: Gangs the client asked to cancel, and those whose cancel it was answered.
    cancel_asked: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)

    @classmethod
    def collect(cls, centre: Centre, members: Iterable[Member], load: Load) -> Evidence:
        runs: list[PodRun] = []
        running: dict[str, Holding] = {}
        leftovers: list[str] = []
        entries = centre.entries()
        for member in members:
            for r in member.intervals():
                labels = r.get("labels") or {}
                gang = _gang_key(labels.get(WORKLOAD_LABEL, ""))
                if gang:
                    end = float("inf") if r["end"] is None else float(r["end"])
                    runs.append(
                        PodRun(
                            member.name,
                            gang,
                            labels.get(ADMISSION_LABEL, ""),
                            r["uid"],
                            float(r["start"]),
                            end,
                        )
                    )
            if member.final is not None:
                continue
            jobs, pods = member.ours()
            leftovers += [f"{member.name}/{j['metadata']['name']}" for j in jobs]
            for pod in pods:
                if (pod.get("status") or {}).get("phase") != "Running":
                    continue
                gang = _gang_key((pod["metadata"].get("labels") or {}).get(WORKLOAD_LABEL, ""))
                held = running.get(gang)
                gpus = _pod_gpus(pod) + (held.amounts.get(GPU, 0) if held else 0)
                running[gang] = Holding(member.name, {GPU: gpus})
        with load.lock:
            acknowledged, attempted = set(load.acknowledged), set(load.attempted)
            asked, cancelled = set(load.cancel_asked), set(load.cancelled)
        states = centre.states()
        return cls(
            acknowledged, attempted, entries, states, runs, running, leftovers, asked, cancelled
        )


def running_gangs(records: Iterable[Mapping[str, Any]], since: float = 0.0) -> set[str]:
    """The gangs with a pod running, by a member's intervals (that began
    running after ``since``, wall time)."""
    gangs = {
        _gang_key((r.get("labels") or {}).get(WORKLOAD_LABEL, ""))
        for r in records
        if r["end"] is None and r["start"] > since
    }
    return gangs - {""}


def _gang_key(label: str) -> str:
    """``team-a.c0001`` → ``team-a/c0001`` (namespaces hold no dot)."""
    namespace, _, name = label.partition(".")
    return f"{namespace}/{name}" if name else ""


def _pod_gpus(pod: Mapping[str, Any]) -> int:
    return sum(
        int(((c.get("resources") or {}).get("requests") or {}).get(GPU, 0))
        for c in (pod.get("spec") or {}).get("containers") or ()
    )


@dataclass
class CheckResult:
    name: str
    problems: list[str]
    counts: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "problems": len(self.problems),
            "examples": self.problems[:10],
            **self.counts,
        }


def _key(entry: LedgerEntry) -> str:
    return f"{entry.body.get('namespace')}/{entry.body.get('workload')}"


def check_lost(evidence: Evidence) -> CheckResult:
    """Every acknowledged submission is in the ledger and has finished (a
    cancel answered 200 ends it cancelled), or runs (open in the ledger and
    running on the member the ledger says); none ended cancelled that no
    client asked to cancel."""
    submitted = {_key(e) for e in evidence.entries if e.kind == "workload.submitted"}
    last: dict[str, LedgerEntry] = {}  # the last submission, admission or release
    for entry in evidence.entries:
        if entry.kind in ("workload.submitted", "workload.admitted") or entry.kind in RELEASING:
            last[_key(entry)] = entry
    finished = {k for k, e in last.items() if e.kind == "workload.finished"}
    cancelled = {k for k, (state, _) in evidence.states.items() if state == "Cancelled"}
    runs_now = {
        k
        for k, e in last.items()
        if e.kind == "workload.admitted"
        and k in evidence.running
        and evidence.running[k].cluster == e.body.get("cluster")
    }
    ended = finished | (cancelled & evidence.cancelled)
    problems = [
        f"{k}: acknowledged, no workload.submitted entry"
        for k in sorted(evidence.acknowledged - submitted)
    ]
    problems += [
        f"{k}: acknowledged, neither finished nor running (state "
        f"{evidence.states.get(k, ('absent', None))[0]}, last entry "
        f"{last[k].kind if k in last else 'none'})"
        for k in sorted((evidence.acknowledged & submitted) - ended - runs_now)
    ]
    problems += [f"{k}: cancelled, never asked" for k in sorted(cancelled - evidence.cancel_asked)]
    return CheckResult(
        "lost",
        problems,
        {
            "acknowledged": len(evidence.acknowledged),
            "in_ledger": len(evidence.acknowledged & submitted),
            "finished": len(evidence.acknowledged & finished),
            "cancelled": len(evidence.acknowledged & cancelled),
            "running": len(evidence.acknowledged & runs_now),
        },
    )


def check_unexpected(evidence: Evidence) -> CheckResult:
    """Nothing in the ledger, the read model or on a member that no client
    submitted; each submitted once; no run on a member under more admissions
    than the ledger made there."""
    known = evidence.attempted
    problems: list[str] = []
    submissions = Counter(_key(e) for e in evidence.entries if e.kind == "workload.submitted")
    in_ledger = {_key(e) for e in evidence.entries if e.kind.startswith("workload.")}
    problems += [f"{k}: in the ledger, never submitted" for k in sorted(in_ledger - known)]
    problems += [f"{k}: submitted {n} times" for k, n in sorted(submissions.items()) if n > 1]
    problems += [
        f"{k}: in the read model, never submitted" for k in sorted(set(evidence.states) - known)
    ]
    on_members = {r.gang for r in evidence.runs}
    problems += [f"{k}: ran on a member, never submitted" for k in sorted(on_members - known)]
    admitted_to = Counter(
        (_key(e), str(e.body.get("cluster")))
        for e in evidence.entries
        if e.kind == "workload.admitted"
    )
    admissions_ran: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in evidence.runs:
        admissions_ran[(r.gang, r.cluster)].add(r.admission)
    for (key, cluster), admissions in sorted(admissions_ran.items()):
        if len(admissions) > admitted_to[(key, cluster)]:
            problems.append(
                f"{key}: ran on {cluster} under {len(admissions)} admissions, "
                f"the ledger admitted it there {admitted_to[(key, cluster)]} times"
            )
    return CheckResult(
        "unexpected",
        problems,
        {
            "submitted": len(known),
            "in_doubt": len(known - evidence.acknowledged),
            "in_ledger": len(in_ledger),
            "gangs_on_members": len(on_members),
            "pod_runs": len(evidence.runs),
        },
    )


def check_admitted_twice(evidence: Evidence) -> CheckResult:
    """No ``workload.admitted`` of a gang that holds an admission (no
    release between), and no release of one that holds nothing."""
    holding: set[str] = set()
    problems: list[str] = []
    admissions = again = 0
    released_once: set[str] = set()
    for entry in evidence.entries:
        key = _key(entry)
        if entry.kind == "workload.admitted":
            admissions += 1
            if key in holding:
                problems.append(f"entry {entry.seq}: {key} admitted again, still holding")
            if key in released_once:
                again += 1
            holding.add(key)
        elif entry.kind in RELEASING:
            holding.discard(key)
            released_once.add(key)
        elif entry.kind == "cluster.lost":
            for requeued in entry.body.get("requeued") or ():
                holding.discard(str(requeued))
    problems += double_closes(evidence.entries)
    releases = Counter(e.kind for e in evidence.entries if e.kind in RELEASING)
    return CheckResult(
        "admitted twice without a release between",
        problems,
        {
            "admissions": admissions,
            "admitted_again_after_release": again,
            "evicted": releases["workload.evicted"],
            "preempted": releases["workload.preempted"],
            "finished": releases["workload.finished"],
        },
    )


def check_two_places(evidence: Evidence) -> CheckResult:
    """No gang with pods running in two clusters at one instant, nor under
    two admissions at once in one."""
    by_gang: dict[str, list[PodRun]] = defaultdict(list)
    for r in evidence.runs:
        by_gang[r.gang].append(r)
    problems: list[str] = []
    moved = 0
    for key, runs in sorted(by_gang.items()):
        if len({r.cluster for r in runs}) > 1:
            moved += 1
        runs.sort(key=lambda r: r.start)
        for i, a in enumerate(runs):
            for b in runs[i + 1 :]:
                if b.start >= a.end:
                    break  # sorted by start: this one and the rest begin after a ended
                if (a.cluster, a.admission) != (b.cluster, b.admission):
                    where = "two clusters" if a.cluster != b.cluster else "two admissions"
                    problems.append(
                        f"{key}: in {where} at once, {a.cluster} [{a.start:.3f}, {a.end:.3f}) "
                        f"and {b.cluster} [{b.start:.3f}, {b.end:.3f})"
                    )
    return CheckResult(
        "running in two clusters at once",
        problems,
        {
            "gangs_that_ran": len(by_gang),
            "gangs_that_ran_in_two_clusters": moved,
            "pod_runs": len(evidence.runs),
        },
    )


def check_members_match(evidence: Evidence) -> CheckResult:
    """The ledger's open usage is what the live members run (GPUs), and no
    job of ours is left on them."""
    problems = audit(evidence.entries, evidence.running, resources={GPU})
    problems += [f"{j}: left on its member" for j in evidence.leftover_jobs]
    return CheckResult(
        "ledger's open usage = what members run",
        problems,
        {"running_now": len(evidence.running), "jobs_left": len(evidence.leftover_jobs)},
    )


def check(evidence: Evidence) -> list[CheckResult]:
    return [
        check_lost(evidence),
        check_unexpected(evidence),
        check_admitted_twice(evidence),
        check_two_places(evidence),
        check_members_match(evidence),
    ]


def ledger_sound(centre: Centre) -> CheckResult:
    verification = PostgresLedgerReader(centre.engine).verify()
    problems = [f"seq {b.seq}: {b.reason}" for b in verification.breaks]
    mismatches, kinds = ledger_matches_events(centre.engine)
    problems += mismatches
    return CheckResult(
        "ledger verifies and matches the events",
        problems,
        {"entries": verification.entries, "matched_with_events": sum(kinds.values())},
    )


def table(checks: Sequence[CheckResult]) -> str:
    """The checks as a Markdown table."""
    lines = ["| check | problems | counts |", "|---|---|---|"]
    for c in checks:
        counts = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in c.counts.items())
        lines.append(f"| {c.name} | {len(c.problems)} | {counts} |")
        lines += [f"|   ↳ | | {p} |" for p in c.problems[:5]]
    return "\n".join(lines)
