"""The run: the stack started, the load, each fault and its recovery, the drain,
then the checks."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from service.app.migrate import upgrade
from service.runtime.demo import register_clusters
from service.runtime.supervisor import Child
from tests.waiting import LONG_CEILING
from tests.waiting import wait_for as wait_until
from tests.workers.chaos.centre import HOLDING, Centre
from tests.workers.chaos.checks import (
    CheckResult,
    Evidence,
    check,
    ledger_sound,
    running_gangs,
    table,
)
from tests.workers.chaos.config import FAULTS, HIGH, MEMBERS, SETTINGS, TEAMS, Size
from tests.workers.chaos.load import Load
from tests.workers.chaos.members import Member, kill, start_agent, start_members
from tests.workers.stack import (
    TOKEN,
    PrivatePostgres,
    PrivateRedis,
    Stack,
    base_manifests,
    gang,
    local_queue,
    manifest,
    private_postgres,
    private_redis,
    team_queue,
    write_fleet,
)
from tests.workers.tcp_cut import TcpCut, tcp_cut


@dataclass
class Phase:
    name: str
    began: float
    took: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Run:
    """What a run saw and what its checks found."""

    size: Size
    phases: list[Phase] = field(default_factory=list)
    answers: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    processes_left: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "size": dataclasses.asdict(self.size),
            "settings": SETTINGS,
            "seconds": round(self.seconds, 1),
            "phases": [
                {"name": p.name, "at": round(p.began, 1), "took": round(p.took, 1), **p.detail}
                for p in self.phases
            ],
            "answers": dict(sorted(self.answers.items())),
            "client_failures": self.failures[:20],
            "checks": [c.to_json() for c in self.checks],
            "ok": self.ok,
        }


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Runner:
    def __init__(self, workdir: Path, size: Size, say: Callable[[str], None] = _say) -> None:
        self.workdir = workdir
        self.size = size
        self.say = say
        self.run = Run(size)
        self.t0 = time.monotonic()

    def _elapsed(self) -> float:
        return time.monotonic() - self.t0

    @contextmanager
    def phase(self, name: str, what: str) -> Iterator[Phase]:
        phase = Phase(name, self._elapsed())
        self.say(f"[{phase.began:6.1f} s] {name:<12} {what}")
        yield phase
        phase.took = self._elapsed() - phase.began
        self.run.phases.append(phase)
        said = ", ".join(f"{k} {v}" for k, v in phase.detail.items())
        self.say(f"[{self._elapsed():6.1f} s] {'':<12} done in {phase.took:.1f} s; {said}")

    def execute(self) -> Run:
        self._children: list[Child] = []
        try:
            with ExitStack() as exits:
                self._execute(exits)
        finally:
            self.run.seconds = self._elapsed()
            # Everything started is stopped: no process of any part lives on.
            self.run.processes_left = [
                f"{c.name} (pid {p.pid})" for c in self._children for p in c.stragglers()
            ] + [f"{c.name} (pid {c.pid})" for c in self._children if c.alive]
        return self.run

    def _execute(self, exits: ExitStack) -> None:
        c = self._start(exits)
        with self.phase(
            "load", f"{self.size.rate:g} submissions/s, {self.size.warmup:g} s before faults"
        ):
            c.load.start()
            time.sleep(self.size.warmup)
            wait_until(lambda: c.load.acknowledged, LONG_CEILING, "first acknowledgements")
        for fault in FAULTS:
            if fault not in self.size.faults:
                continue
            getattr(self, "_" + fault.replace("-", "_"))(c)
            time.sleep(self.size.between)
        if self.size.rogue:
            self._rogue(c.stack, self.size.rogue)
        self._drain(c)
        self.run.answers = dict(c.load.answers)
        self.run.failures = list(c.load.failures)
        with self.phase("check", "ledger, read model and members' running intervals"):
            evidence = Evidence.collect(c.centre, c.members.values(), c.load)
            self.run.checks = check(evidence)
            self.run.checks.append(ledger_sound(c.centre))
        self.say(table(self.run.checks))

    def _start(self, exits: ExitStack) -> _Context:
        size = self.size
        with self.phase("start", "Postgres, Redis, 3 members, 2 APIs, worker, 2 schedulers"):
            postgres = exits.enter_context(private_postgres(durable=True))
            admin = sa.create_engine(postgres.server_url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.exec_driver_sql("CREATE DATABASE qm")
            admin.dispose()
            url = postgres.url("qm")
            upgrade(url)
            redis_server = exits.enter_context(private_redis())
            stack = exits.enter_context(Stack(self.workdir, url, redis_server.url, SETTINGS))
            exits.callback(self._remember, stack)
            centre = Centre(url)
            exits.callback(centre.engine.dispose)
            fleet = write_fleet(self.workdir / "fleet.yaml", {m: (1, size.nodes) for m in MEMBERS})
            members = start_members(stack, fleet, size)
            relays = {}
            for name, member in members.items():
                upstream = urlsplit(member.stand_in.server)
                relays[name] = exits.enter_context(
                    tcp_cut((str(upstream.hostname), int(upstream.port or 443)))
                )
            stack.start_api()
            stack.start_api()
            stack.start_worker()
            stack.start_scheduler()
            stack.start_scheduler(standby=True)
            gpus = len(MEMBERS) * size.nodes * 8
            manifests = [*base_manifests()]
            if size.high_every:
                high = manifest("WorkloadPriorityClass", HIGH, {})
                del high["spec"]  # its value is at the top level, as in Kueue
                manifests.append({**high, "value": 1000})
            for team in TEAMS:
                manifests += [_team_queue(team, gpus, size), local_queue(team, team)]
            registered = [
                dataclasses.replace(m.stand_in, server=f"https://{relays[m.name].address}")
                for m in members.values()
            ]
            with stack.client() as api:
                for obj in manifests:
                    stack.create(api, obj)
                seeded = register_clusters(api, registered)
                assert not seeded.failed, seeded.failed
            stack.members = registered
            for name in size.agents:
                start_agent(stack, members[name])
            wait_until(stack.clusters_ready, LONG_CEILING, "members Ready")
            wait_until(
                lambda: self._guarded(stack) >= set(size.agents),
                LONG_CEILING,
                "fence agents reporting",
                seen=lambda: self._guarded(stack),
            )
        load = Load(list(stack.api_urls.values()), size, TOKEN)
        exits.callback(load.close)
        return _Context(size, stack, centre, load, members, relays, postgres, redis_server)

    def _drain(self, c: _Context) -> None:
        load, centre, members = c.load, c.centre, c.members
        with self.phase(
            "drain", "load stopped; in-doubt submissions settled; gangs finish"
        ) as phase:
            load.halt.set()
            load.join(30)
            load.settle(180)
            acked = set(load.acknowledged)
            with contextlib.suppress(AssertionError):  # what has not is for `lost` to say
                wait_until(
                    lambda: self._ended(centre, acked),
                    LONG_CEILING * 2,
                    "every acknowledged gang finished",
                    seen=lambda: Counter(s for s, _ in centre.states().values()),
                )
            states = centre.states()
            phase.detail["acknowledged"] = len(acked)
            phase.detail["not_ended"] = sum(
                1 for k in acked if states.get(k, ("?", None))[0] not in ENDED
            )
            live = [m for m in members.values() if m.final is None]
            with contextlib.suppress(AssertionError):
                wait_until(lambda: not any(m.ours()[0] for m in live), 120, "members left clean")

    # -- what each fault is ------------------------------------------------------------

    def _fault(
        self,
        name: str,
        what: str,
        inject: Callable[[], Any],
        recovered: Callable[[float], Any],
        ceiling: float = LONG_CEILING,
    ) -> Phase:
        """Inject, then wait until ``recovered(t)`` with ``t`` the wall time
        at which the injection was over."""
        with self.phase(name, what) as phase:
            detail = inject() or {}
            phase.detail.update(detail)
            after = time.time()
            wait_until(lambda: recovered(after), ceiling, f"recovery from {name}")
        return phase

    def _worker(self, c: _Context) -> None:
        victim = c.stack.workers[-1]

        def inject() -> dict[str, Any]:
            kill(victim)
            time.sleep(1)
            c.stack.start_worker()
            return {"killed": victim.name}

        self._fault(
            "worker",
            f"SIGKILL Celery worker {victim.name} (pid {victim.pid}); a new one",
            inject,
            lambda at: all(c.centre.work_after(at).values()),
        )

    def _scheduler(self, c: _Context) -> None:
        (leader,) = wait_until(c.stack.leaders, LONG_CEILING, "one leader")

        def recovered(at: float) -> bool:
            leading = c.stack.leaders()
            return (
                bool(leading)
                and leading[0] is not leader
                and bool(c.centre.work_after(at)["admitted"])
            )

        phase = self._fault(
            "scheduler",
            f"SIGKILL admission leader {leader.name} (pid {leader.pid}); the standby leads",
            lambda: kill(leader),
            recovered,
        )
        phase.detail["leader"] = c.stack.leaders()[0].name
        c.stack.start_scheduler(standby=True)

    def _api(self, c: _Context) -> None:
        name, url = next(iter(c.stack.api_urls.items()))
        victim = next(x for x in c.stack.supervisor.children if x.name == name and x.alive)
        port = int(urlsplit(url).port or 0)

        def recovered(at: float) -> bool:
            return c.load.acked_since(at) >= 3

        self._fault(
            "api",
            f"SIGKILL API process {name} (pid {victim.pid}); the other serves",
            lambda: kill(victim),
            recovered,
        )
        c.stack.start_api(port=port)  # the same URL, a new process

    def _redis(self, c: _Context) -> None:
        def inject() -> None:
            c.redis.stop()
            time.sleep(1)
            c.redis.start()

        self._fault(
            "redis",
            "kill redis-server (all it held lost) and start it empty",
            inject,
            lambda at: all(c.centre.work_after(at).values()),
        )

    def _postgres(self, c: _Context) -> None:
        def inject() -> None:
            c.centre.reset()
            c.postgres.stop("immediate")
            time.sleep(2)
            c.postgres.start()

        def recovered(at: float) -> bool:
            return c.load.acked_since(at) >= 3 and all(c.centre.work_after(at).values())

        self._fault(
            "postgres",
            "crash Postgres (pg_ctl stop -m immediate), start it again",
            inject,
            recovered,
        )

    @staticmethod
    def _target(c: _Context, *, long: bool) -> str:
        """The live member (not cut off) running the most
        gangs, waited for until it runs one: admission packs gangs, so under
        a light load one member may run them all, and the busiest is the one
        whose loss moves the most. With ``long``: the most long gangs that
        began running in the last ``Size.fresh`` seconds, which will still
        run when the centre requeues them (a lease later)."""

        def pick() -> str | None:
            scores = {}
            fresh = time.time() - c.size.fresh
            for name, member in c.members.items():
                if member.final is not None or name in c.cut:
                    continue
                records = member.intervals()
                gangs = running_gangs(records)
                longs = len(running_gangs(records, fresh) & c.load.long_keys())
                scores[name] = (longs if long else len(gangs), len(gangs))
            ranked = sorted(scores, key=lambda n: (-scores[n][0], -scores[n][1], n))
            return ranked[0] if ranked and scores[ranked[0]][0] else None

        what = "a member running a long gang" if long else "a member running a gang"
        found: str = wait_until(pick, LONG_CEILING, what)
        return found

    @staticmethod
    def _kill_member(c: _Context, name: str) -> dict[str, Any]:
        """The member and its agent SIGKILLed, for good; its record of
        intervals read just before (a pod that began running in between is
        not seen), the pods running then ended at the kill."""
        member = c.members[name]
        records = member.intervals()
        now = time.time()
        if member.agent is not None:
            kill(member.agent)
        kill(member.child)
        member.killed_at = now
        member.final = [{**r, "end": r["end"] or now} for r in records]
        c.moved[name] = running_gangs(records)
        return {"killed": name, f"gangs_running_on_{name}": len(c.moved[name])}

    @staticmethod
    def _cut(c: _Context, name: str) -> dict[str, Any]:
        running = running_gangs(c.members[name].intervals())
        c.relays[name].cut()
        c.cut.add(name)
        c.moved[name] = running
        return {
            "cut": name,
            f"gangs_running_on_{name}": len(running),
            f"long_gangs_running_on_{name}": len(running & c.load.long_keys()),
        }

    @staticmethod
    def _requeued_from(c: _Context, name: str, since: float) -> bool:
        """The member is Lost, holds nothing, and every gang that ran there
        at the fault has ended, or was admitted to another member since
        (where a higher-priority gang may have preempted it again)."""
        if c.centre.cluster_state(name) != "Lost":
            return False
        states = c.centre.states()
        if any(s in HOLDING and at == name for s, at in states.values()):
            return False
        moved = [g for g in c.moved.get(name, ()) if g in states]
        if all(states[g][0] in ENDED for g in moved):
            return True
        elsewhere = c.centre.admitted_elsewhere(name, since)
        return all(states[g][0] in ENDED or g in elsewhere for g in moved)

    def _member_kill(self, c: _Context) -> None:
        name = self._target(c, long=False)
        self._fault(
            "member-kill",
            f"SIGKILL the busiest member, {name}, and its fence agent, for good",
            lambda: self._kill_member(c, name),
            lambda at: self._requeued_from(c, name, at),
        )

    def _partition(self, c: _Context) -> None:
        name = self._target(c, long=True)
        self._fault(
            "partition",
            f"cut the centre's link to {name}, running the most long gangs (its agent "
            "runs on), until its gangs are requeued",
            lambda: self._cut(c, name),
            lambda at: self._requeued_from(c, name, at),
        )
        self._heal(c, name)

    def _heal(self, c: _Context, name: str) -> None:
        with self.phase("heal", f"the link to {name} back") as phase:
            c.relays[name].listen()
            c.cut.discard(name)
            wait_until(
                lambda: c.centre.cluster_state(name) == "Ready", LONG_CEILING, f"{name} Ready"
            )
            agent = c.members[name].agent
            said = agent.output() if agent is not None else ""
            # What its agent stopped while it was cut off (its log says each time).
            phase.detail["agent_deleted_jobs_so_far"] = sum(
                int(n) for n in re.findall(r"deleted (\d+) jobs", said)
            )

    def _rogue(self, stack: Stack, count: int) -> None:
        what = f"{count} workloads created behind the client's back"
        with self.phase("rogue", what), stack.client() as api:
            for i in range(count):
                api.post("/v1/namespaces/team-a/workloads", json=gang(f"rogue{i}", 4, 100))

    # -- helpers -------------------------------------------------------------------------

    @staticmethod
    def _guarded(stack: Stack) -> set[str]:
        with stack.client() as api:
            items = api.get("/v1/clusters").json().get("items") or []
        return {
            c["metadata"]["name"]
            for c in items
            if ((c.get("status") or {}).get("fence") or {}).get("guaranteed")
        }

    @staticmethod
    def _ended(centre: Centre, acked: set[str]) -> bool:
        states = centre.states()
        return all(states.get(k, ("?", None))[0] in ENDED for k in acked)

    def _remember(self, stack: Stack) -> None:
        """Runs just before the stack is stopped: which children it had."""
        for child in stack.supervisor.children:
            child.snapshot()
        self._children = list(stack.supervisor.children)


ENDED = ("Finished", "Cancelled")


@dataclass
class _Context:
    size: Size
    stack: Stack
    centre: Centre
    load: Load
    members: dict[str, Member]
    #: The centre reaches each member through one of these.
    relays: dict[str, TcpCut]
    postgres: PrivatePostgres
    redis: PrivateRedis
    #: Members cut off from the centre now.
    cut: set[str] = field(default_factory=set)
    #: The gangs running on a member when it was killed or cut off.
    moved: dict[str, set[str]] = field(default_factory=dict)


def _team_queue(team: str, fleet_gpus: int, size: Size) -> dict[str, Any]:
    """A team's ClusterQueue: its share of the fleet, and with ``preemption``
    as much again to borrow, reclaimed and preempted for by priority."""
    nominal = int(fleet_gpus * size.nominal_fraction) // len(TEAMS)
    if not size.preemption:
        return team_queue(team, nominal)
    policy = {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
    return team_queue(team, nominal, borrowing_limit=nominal, preemption=policy)
