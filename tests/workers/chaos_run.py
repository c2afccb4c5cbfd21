"""A repeatable fault run (issue 18, "Must show"): the whole stack as
processes, under a steady load of submissions, through one fault after
another, then checked from the ledger and from what the members ran.

Used by ``bench/chaos.py`` (the full run, figures committed) and by
``tests/workers/test_chaos_run.py`` (sized down). What runs:

* a private Postgres (``pg_ctl``, commits durable as the service asks) and
  a private ``redis-server`` (no persistence), on free ports;
* two API processes, a Celery worker, two schedulers (a leader and one
  standing by), three stand-in members ``m1`` to ``m3``, each a process of its
  own with a fence agent (``quartermaster fence-agent``) beside it; the
  centre reaches each member through a TCP relay that the run may cut
  (tests/workers/tcp_cut.py), while the member's agent still reaches it;
* a client that submits gangs at a steady rate, each with its
  ``Idempotency-Key``, to either API process (the other when one refuses
  connections), and retries what it was not told the outcome of with the
  same key until it is.

The faults, in order, each under that load: a Celery worker SIGKILLed (a
new one started), the admission leader SIGKILLed (the standby takes over; a
new standby started), an API process SIGKILLed (the other serves; it is
started again on its port), Redis killed and started empty, Postgres
crashed (``pg_ctl stop -m immediate``) and started; the centre's link to
the member running the most long gangs that began lately cut (its agent
runs on: it must stop them) until the centre has requeued its gangs and
they run elsewhere, then healed; the member running the most gangs
SIGKILLed with its agent, for good, until its gangs run elsewhere
(admission packs gangs, so the busiest member is the one whose loss moves
the most; a fault waits until its member runs what it is aimed at). Then
the load stops, every in-doubt submission is settled, and every
acknowledged gang is waited for until it has finished.

The checks (:func:`check`), from the ledger, the read model and the
members' kubelets' record of every pod's running intervals
(``/_admin/intervals``; the killed member's read just before it is killed,
the pods still running then ended at the kill):

* lost = ∅: every acknowledged submission has its ``workload.submitted``
  entry and has finished (or runs, where the members say it does);
* unexpected = ∅: every gang in the ledger, on a member or in the read
  model is one a client submitted (acknowledged or in doubt), submitted
  once; a gang ran on a member under no more admissions than the ledger
  admitted it there;
* no gang admitted twice without a release (finish, eviction, preemption,
  requeue) between, and no admission closed twice (``double_closes``);
* no gang's pods running in two clusters at one instant (nor under two
  admissions in one);
* besides: the ledger verifies, matches the events, its open usage equals
  what the members run (``audit``), and the live members are left holding
  no job of ours.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import kubernetes
import sqlalchemy as sa

from service.app.bootstrap import make_engine
from service.app.migrate import upgrade
from service.ledger.accounting import RELEASING, Holding, audit, double_closes
from service.ledger.chain import LedgerEntry
from service.ledger.postgres import PostgresLedgerReader
from service.runtime.demo import StandIn, register_clusters, stand_ins
from service.runtime.supervisor import Child
from tests.waiting import LONG_CEILING
from tests.waiting import wait_for as wait_until
from tests.workers.invariants import ledger_matches_events
from tests.workers.stack import (
    FAST,
    GPU,
    TOKEN,
    PrivatePostgres,
    PrivateRedis,
    Stack,
    base_manifests,
    gang,
    local_queue,
    private_postgres,
    private_redis,
    team_queue,
    write_fleet,
)
from tests.workers.tcp_cut import TcpCut, tcp_cut

WORKLOAD_LABEL = "quartermaster.dev/workload"
ADMISSION_LABEL = "quartermaster.dev/admission"
TEAMS = ("team-a", "team-b")
MEMBERS = ("m1", "m2", "m3")
#: Quick cycles and heartbeats, and fencing consistent as workers/settings.py
#: demands: the write window W = 2 x 1 s heartbeats + 1 s + 3 s timeouts = 6 s;
#: the margin covers a 0.5 s poll, 1.5 s to stop and 1 % drift of the 10 s
#: fence time; the lease is at least 10 + 3 + 6. A fence time longer than the
#: Postgres outage keeps that outage from fencing every member.
SETTINGS = {
    **FAST,
    "QM_RESYNC_INTERVAL": "0.5",
    "QM_HEARTBEAT_INTERVAL": "1",
    "QM_MEMBER_CONNECT_TIMEOUT": "1",
    "QM_MEMBER_READ_TIMEOUT": "3",
    "QM_FENCE_TIME": "10",
    "QM_FENCE_POLL_INTERVAL": "0.5",
    "QM_FENCE_STOP_TIME": "1.5",
    "QM_FENCE_MARGIN": "3",
    "QM_CLUSTER_LEASE": "20",
}
FAULTS = ("worker", "scheduler", "api", "redis", "postgres", "partition", "member-kill")


@dataclass(frozen=True)
class Size:
    """How big a run is."""

    #: Submissions per second, for the whole run until the drain.
    rate: float = 1.0
    #: Seconds of load before the first fault, and after each recovery.
    warmup: float = 15.0
    between: float = 8.0
    #: How long each gang runs on a member, real seconds (uniform).
    run_seconds: tuple[float, float] = (2.0, 8.0)
    #: Every n-th submission is a long gang of 4 GPUs running this long (real
    #: seconds): longer than the fence time, so that a partition finds some
    #: that its member's agent must stop, and longer than the lease.
    long_every: int = 8
    long_seconds: tuple[float, float] = (40.0, 50.0)
    #: A partition is aimed at the member running the most long gangs that
    #: began running in the last ``fresh`` seconds (so that they still run
    #: when the centre requeues them, a lease later).
    fresh: float = 10.0
    #: 8-GPU nodes per member (one fabric island).
    nodes: int = 6
    seed: int = 18
    #: Stand-ins' simulated time per real second's worth (``--time-scale``).
    time_scale: float = 0.01
    #: Which members run a fence agent (``m2``'s is what keeps the partition safe).
    agents: tuple[str, ...] = MEMBERS
    #: Faults to inject, in :data:`FAULTS` order.
    faults: tuple[str, ...] = FAULTS
    #: Workloads created behind the client's back (to see ``unexpected`` catch them).
    rogue: int = 0


# --- the client ---------------------------------------------------------------------------


@dataclass
class Submission:
    key: str  # namespace/name
    body: dict[str, Any]
    due: float = 0.0
    attempts: int = 0


class Load(threading.Thread):
    """Submits a gang every 1/rate s (open loop: late when behind, never in a
    burst) to the API processes in turn, the next one at once when one
    refuses the connection; a submission whose outcome it was not told (a
    503, a 409 "in flight", a broken connection) is retried later with the
    same key, between new ones, until it is answered."""

    def __init__(self, urls: Sequence[str], size: Size, token: str) -> None:
        super().__init__(daemon=True, name="load")
        self.urls = list(urls)
        self.size = size
        self.clients = [
            httpx.Client(base_url=u, headers={"Authorization": f"Bearer {token}"}, timeout=5)
            for u in self.urls
        ]
        self.random = random.Random(size.seed)
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.attempted: dict[str, Submission] = {}
        self.acknowledged: dict[str, float] = {}  # key -> wall time of its 201
        self.waiting: deque[Submission] = deque()
        #: The long gangs' keys.
        self.long: set[str] = set()
        self.answers: Counter[str] = Counter()
        self.failures: list[str] = []
        self.turn = 0

    def _next(self, number: int) -> Submission:
        team = TEAMS[number % len(TEAMS)]
        name = f"c{number:04d}"
        gpus = self.random.choice((4, 8, 8, 16))
        low, high = self.size.run_seconds
        key = f"{team}/{name}"
        if self.size.long_every and number % self.size.long_every == self.size.long_every - 1:
            gpus, (low, high) = 4, self.size.long_seconds
            with self.lock:
                self.long.add(key)
        seconds = self.random.uniform(low, high) / self.size.time_scale
        return Submission(key, gang(name, gpus, round(seconds)))

    def run(self) -> None:
        start, number = time.monotonic(), 0
        while not self.halt.is_set():
            due = start + number / self.size.rate
            if self.halt.wait(max(0.0, due - time.monotonic())):
                break
            self._retry_due(limit=3)
            submission = self._next(number)
            number += 1
            with self.lock:
                self.attempted[submission.key] = submission
            self._send(submission)

    def _retry_due(self, limit: int) -> None:
        now = time.monotonic()
        for _ in range(min(limit, len(self.waiting))):
            if self.waiting[0].due > now:
                return
            self._send(self.waiting.popleft())

    def settle(self, ceiling: float) -> None:
        """After the load: retry what is in doubt until each is answered."""
        deadline = time.monotonic() + ceiling
        while self.waiting and time.monotonic() < deadline:
            self._retry_due(limit=len(self.waiting))
            time.sleep(0.2)

    def _send(self, submission: Submission) -> None:
        submission.attempts += 1
        namespace = submission.key.split("/")[0]
        for hop in range(len(self.clients)):
            client = self.clients[(self.turn + hop) % len(self.clients)]
            try:
                response = client.post(
                    f"/v1/namespaces/{namespace}/workloads",
                    json=submission.body,
                    headers={"Idempotency-Key": f"chaos-{submission.key}"},
                )
            except httpx.ConnectError:
                self.answers["ConnectError"] += 1
                continue  # that process is down: the other one, now
            except httpx.TransportError as error:
                self.answers[type(error).__name__] += 1
                self._later(submission, 1.0)
                break
            self._answered(submission, response)
            break
        else:
            self._later(submission, 0.5)
        self.turn += 1

    def _answered(self, submission: Submission, response: httpx.Response) -> None:
        status = response.status_code
        problem = ""
        if response.headers.get("content-type", "").startswith("application/problem+json"):
            with contextlib.suppress(ValueError):
                problem = str(response.json().get("type", "")).rsplit("/", 1)[-1]
        self.answers[f"{status} {problem}".strip()] += 1
        if status == 201:
            with self.lock:
                self.acknowledged[submission.key] = time.time()
        elif status in (503, 429) or (status == 409 and problem == "idempotency-key-in-flight"):
            self._later(submission, float(response.headers.get("retry-after") or 1))
        else:
            self.failures.append(f"{submission.key}: {status} {response.text[:200]}")
            if status >= 500:
                self._later(submission, 1.0)

    def _later(self, submission: Submission, seconds: float) -> None:
        submission.due = time.monotonic() + min(seconds, 5.0)
        self.waiting.append(submission)

    def long_keys(self) -> set[str]:
        with self.lock:
            return set(self.long)

    def acked_since(self, moment: float) -> int:
        with self.lock:
            return sum(1 for at in self.acknowledged.values() if at > moment)

    def close(self) -> None:
        self.halt.set()
        if self.is_alive():
            self.join(30)
        for client in self.clients:
            client.close()


# --- the members --------------------------------------------------------------------------


@dataclass
class Member:
    """One stand-in member cluster: its own process, kubeconfig and agent."""

    name: str
    child: Child
    kubeconfig: Path
    stand_in: StandIn
    admin: tuple[str, str]
    agent: Child | None = None
    #: Its intervals as read just before it was killed, and when.
    final: list[dict[str, Any]] | None = None
    killed_at: float | None = None

    def intervals(self) -> list[dict[str, Any]]:
        if self.final is not None:
            return self.final
        url, token = self.admin
        answer = httpx.get(
            f"{url}/_admin/intervals", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        answer.raise_for_status()
        records: list[dict[str, Any]] = answer.json()
        return records

    def api(self) -> Any:
        new_client: Any = kubernetes.config.new_client_from_config
        return new_client(config_file=str(self.kubeconfig), context=self.name)

    def ours(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Jobs and pods of ours on it now (a fresh list)."""
        with self.api() as api:
            jobs: Any = kubernetes.client.BatchV1Api(api).list_job_for_all_namespaces(
                label_selector=ADMISSION_LABEL, _preload_content=False
            )
            pods: Any = kubernetes.client.CoreV1Api(api).list_pod_for_all_namespaces(
                label_selector=ADMISSION_LABEL, _preload_content=False
            )
            return json.loads(jobs.data)["items"], json.loads(pods.data)["items"]


def start_members(stack: Stack, fleet: Path, size: Size) -> dict[str, Member]:
    """Each member a ``sim cluster`` process of its own (so that one can be
    killed alone), started together and then waited for."""
    (stack.workdir / "clusters").mkdir(parents=True, exist_ok=True)
    started = {}
    for name in MEMBERS:
        kubeconfig = stack.workdir / "clusters" / f"{name}.kubeconfig"
        started[name] = (
            stack.supervisor.start(
                f"member-{name}",
                [
                    *(sys.executable, "-m", "sim.cli", "cluster", "--fleet", str(fleet)),
                    *("--cluster", name, "--port", "0", "--time-scale", str(size.time_scale)),
                    *("--kubeconfig-out", str(kubeconfig)),
                ],
            ),
            kubeconfig,
        )
    members = {}
    for name, (child, kubeconfig) in started.items():

        def up(child: Child = child) -> bool:
            return "kubeconfig written" in child.output() or not child.alive

        wait_until(up, LONG_CEILING, f"member {name}")
        if not child.alive:
            raise RuntimeError(f"member {name} exited:\n{child.tail(30)}")
        (stand_in,) = stand_ins(kubeconfig)
        line = next(x for x in child.output().splitlines() if '"adminToken"' in x)
        entry = json.loads(line)
        members[name] = Member(
            name, child, kubeconfig, stand_in, (entry["admin"], entry["adminToken"])
        )
    return members


def start_agent(stack: Stack, member: Member) -> None:
    member.agent = stack.supervisor.start(
        f"fence-{member.name}",
        [
            *(sys.executable, "-m", "workers.cli", "fence-agent"),
            *("--kubeconfig", str(member.kubeconfig), "--context", member.name),
            *("--poll-interval", SETTINGS["QM_FENCE_POLL_INTERVAL"]),
        ],
    )


def kill(child: Child) -> None:
    """SIGKILL the child's whole process group (a Celery worker's pool,
    uvicorn's workers) and reap it."""
    child.snapshot()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        child.process.wait(10)
    for straggler in child.stragglers():
        with contextlib.suppress(Exception):
            straggler.kill()


# --- reading the centre -------------------------------------------------------------------

_STATES = sa.text(
    "SELECT namespace, name, status->>'state', status->'admission'->>'cluster' "
    "FROM resources WHERE kind = 'Workload' AND NOT deleted"
)
_CLUSTER = sa.text(
    "SELECT status->>'state' FROM resources WHERE kind = 'Cluster' AND name = :name AND NOT deleted"
)
_ADMITTED_AFTER = sa.text(
    "SELECT count(*) FROM events WHERE type = 'WorkloadAdmitted' AND recorded_at > :at"
)
_RECONCILED_AFTER = sa.text(
    "SELECT count(*) FROM processed_messages WHERE outcome = 'done' "
    "AND consumer = 'reconcile.cluster' AND processed_at > :at"
)
HOLDING = ("Admitted", "Running", "Cancelling")


class Centre:
    """Reads of the central database that survive its restarts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size=2)

    def reset(self) -> None:
        self.engine.dispose()

    def _scalar(self, statement: sa.TextClause, **params: Any) -> Any:
        try:
            with self.engine.connect() as conn:
                return conn.execute(statement, params).scalar_one_or_none()
        except sa.exc.DBAPIError:
            self.engine.dispose()
            return None

    def states(self) -> dict[str, tuple[str, str | None]]:
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(_STATES).all()
        except sa.exc.DBAPIError:
            self.engine.dispose()
            return {}
        return {f"{ns}/{name}": (state or "Pending", cluster) for ns, name, state, cluster in rows}

    def cluster_state(self, name: str) -> str | None:
        value = self._scalar(_CLUSTER, name=name)
        return None if value is None else str(value)

    def work_after(self, at: float) -> dict[str, int]:
        moment = datetime.fromtimestamp(at, UTC)
        return {
            "admitted": int(self._scalar(_ADMITTED_AFTER, at=moment) or 0),
            "reconciled": int(self._scalar(_RECONCILED_AFTER, at=moment) or 0),
        }

    def holding_on(self, cluster: str) -> int:
        return sum(1 for s, c in self.states().values() if s in HOLDING and c == cluster)

    def entries(self) -> list[LedgerEntry]:
        return list(PostgresLedgerReader(self.engine).entries())


# --- the run ------------------------------------------------------------------------------


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
            self.run.checks.append(_ledger_sound(c.centre))
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
            for team in TEAMS:
                manifests += [team_queue(team, gpus // len(TEAMS)), local_queue(team, team)]
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
                gangs = _running_gangs(records)
                longs = len(_running_gangs(records, fresh) & c.load.long_keys())
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
        c.moved[name] = _running_gangs(records)
        return {"killed": name, f"gangs_running_on_{name}": len(c.moved[name])}

    @staticmethod
    def _cut(c: _Context, name: str) -> dict[str, Any]:
        running = _running_gangs(c.members[name].intervals())
        c.relays[name].cut()
        c.cut.add(name)
        c.moved[name] = running
        return {
            "cut": name,
            f"gangs_running_on_{name}": len(running),
            f"long_gangs_running_on_{name}": len(running & c.load.long_keys()),
        }

    @staticmethod
    def _requeued_from(c: _Context, name: str) -> bool:
        """The member is Lost, holds nothing, and every gang that ran there
        at the fault runs on another member or has ended."""
        if c.centre.cluster_state(name) != "Lost":
            return False
        states = c.centre.states()
        if any(s in HOLDING and at == name for s, at in states.values()):
            return False
        return all(
            (states[g][0] == "Running" and states[g][1] != name) or states[g][0] in ENDED
            for g in c.moved.get(name, ())
            if g in states
        )

    def _member_kill(self, c: _Context) -> None:
        name = self._target(c, long=False)
        self._fault(
            "member-kill",
            f"SIGKILL the busiest member, {name}, and its fence agent, for good",
            lambda: self._kill_member(c, name),
            lambda at: self._requeued_from(c, name),
        )

    def _partition(self, c: _Context) -> None:
        name = self._target(c, long=True)
        self._fault(
            "partition",
            f"cut the centre's link to {name}, running the most long gangs (its agent "
            "runs on), until its gangs are requeued",
            lambda: self._cut(c, name),
            lambda at: self._requeued_from(c, name),
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


# --- the evidence and the checks ----------------------------------------------------------


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
        return cls(acknowledged, attempted, entries, centre.states(), runs, running, leftovers)


def _running_gangs(records: Iterable[Mapping[str, Any]], since: float = 0.0) -> set[str]:
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
    """Every acknowledged submission is in the ledger and has finished, or
    runs (open in the ledger and running on the member the ledger says)."""
    submitted = {_key(e) for e in evidence.entries if e.kind == "workload.submitted"}
    last: dict[str, LedgerEntry] = {}
    for entry in evidence.entries:
        if entry.kind.startswith("workload."):
            last[_key(entry)] = entry
    finished = {k for k, e in last.items() if e.kind == "workload.finished"}
    runs_now = {
        k
        for k, e in last.items()
        if e.kind == "workload.admitted"
        and k in evidence.running
        and evidence.running[k].cluster == e.body.get("cluster")
    }
    problems = [
        f"{k}: acknowledged, no workload.submitted entry"
        for k in sorted(evidence.acknowledged - submitted)
    ]
    problems += [
        f"{k}: acknowledged, neither finished nor running (state "
        f"{evidence.states.get(k, ('absent', None))[0]}, last entry "
        f"{last[k].kind if k in last else 'none'})"
        for k in sorted((evidence.acknowledged & submitted) - finished - runs_now)
    ]
    return CheckResult(
        "lost",
        problems,
        {
            "acknowledged": len(evidence.acknowledged),
            "in_ledger": len(evidence.acknowledged & submitted),
            "finished": len(evidence.acknowledged & finished),
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


def _ledger_sound(centre: Centre) -> CheckResult:
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
