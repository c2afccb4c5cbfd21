"""One run of a config through the whole stack.

The stack is tests/workers/stack.py's (what standalone mode runs, each a
process of its own): the API, Celery workers, the scheduler, over a private
Postgres (commits durable as the service asks; ``fsync`` off) and a private
Redis; the member clusters are stand-ins (``quartermaster sim cluster``) with
their controllers — scheduler, kubelet, Job controller, Kueue-like admission —
at real time (``--time-scale 1``), one process each, so that one can be
killed alone (or, with ``stand_ins="api"``, their API servers only and the
bench as their kubelet: bench/kueue_perf/kubelet.py). A pod runs its workload's ``runtimeMs`` (its
``quartermaster.dev/sim-duration``), then its Job completes, sync sees it and
the centre records the finish, releasing the quota.

With ``kill_at``, the member holding the most gangs at that moment (after
the generator's start) is SIGKILLed for good: it goes silent, and after
``QM_CLUSTER_LEASE`` the centre marks it Lost and requeues its gangs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.e2e import BoxCpu, _cpu_seconds
from bench.kueue_perf.checks import ledger_sound
from bench.kueue_perf.configs import RACK_LABEL, Config, arrivals
from bench.kueue_perf.kubelet import Kubelets
from bench.kueue_perf.load import Answer, Generator
from bench.kueue_perf.manifests import central_objects, fleet_yaml, member_names, node_count
from bench.kueue_perf.profile import Profilers
from service.app.bootstrap import make_engine
from service.app.migrate import upgrade
from service.runtime.demo import register_clusters, stand_ins
from service.runtime.supervisor import Child
from sim.fleet import load_fleet
from tests.waiting import LONG_CEILING
from tests.waiting import wait_for as wait_until
from tests.workers.chaos.members import Member, kill
from tests.workers.stack import Stack, private_postgres, private_redis

#: Knobs set for the run (the rest are the defaults), as bench/e2e.py sets
#: them, and the lease the issue asks for.
ENV = {
    "QM_MEMBER_QPS": "1000",  # per member; client-go's 5 capped MultiKueue (kueue#8564)
    "QM_MEMBER_BURST": "2000",
    "QM_RATE_LIMIT_PER_SECOND": "100000",  # per principal: the generator is one principal
    "QM_RATE_LIMIT_BURST": "100000",
    "QM_CLUSTER_LEASE": "60",
    "QM_HEARTBEAT_INTERVAL": "10",
    "QM_DB_POOL_SIZE": "16",
}

#: ``--stand-ins api``: no member Kueue, whose Workload updates wake sync the
#: moment a job finishes; a resync every second stands in (as bench/e2e.py).
API_ENV = {"QM_RESYNC_INTERVAL": "1"}


@dataclass(frozen=True)
class Options:
    config: Config
    members: int = 1
    capacity_factor: float = 1.5
    api_processes: int = 2
    workers: int = 1
    worker_concurrency: int = 2
    connections: int = 64
    kill_at: float | None = None
    #: ``controllers``: the stand-ins run each pod (scheduler, kubelet, Job
    #: controller, Kueue-like admission); ``api``: their API servers only, and
    #: the bench completes each Job its runtime after it appeared
    #: (bench/kueue_perf/kubelet.py says why).
    stand_ins: str = "controllers"
    timeout: float = 3600.0
    env: dict[str, str] = field(default_factory=dict)
    #: A py-spy binary: every part is profiled; the raw stacks go to
    #: ``profile_dir`` (else the run's work directory, removed after it).
    py_spy: str | None = None
    profile_dir: Path | None = None
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)


@dataclass
class Kill:
    member: str
    at: float
    #: ``namespace/name`` of the gangs the centre held there when it was killed.
    holding: list[str]
    cpu_seconds: float


@dataclass
class Raw:
    """What a run saw, for :mod:`bench.kueue_perf.measure`."""

    options: Options
    start: float
    answers: list[Answer]
    statuses: dict[str, int]
    ended: float
    states: dict[str, int]
    cpu_before: dict[str, float]
    cpu_after: dict[str, float]
    box_before: dict[str, float]
    box_after: dict[str, float]
    events: list[tuple[str, str, str, str | None, float]]
    entries: list[Any]
    intervals: dict[str, list[dict[str, Any]]]
    #: ``--stand-ins api``: every job seen on a member (cluster, namespace,
    #: name, wall time it appeared), and what the bench's kubelet did.
    jobs: list[tuple[str, str, str, float]]
    #: TAS: each admission's nodes per pod set, and each node's rack.
    placements: list[tuple[str, str, list[list[str]]]]
    racks: dict[str, str]
    completions: dict[str, int]
    ledger_problems: list[str]
    kill: Kill | None
    nodes: int
    load_average: list[tuple[float, float]]
    profiles: dict[str, dict[str, Any]]
    finished_in_time: bool


_STATES = sa.text(
    "SELECT coalesce(status->>'state', 'Pending'), count(*) FROM resources "
    "WHERE kind = 'Workload' AND NOT deleted GROUP BY 1"
)
_HOLDING = sa.text(
    "SELECT namespace || '/' || name, status->'admission'->>'cluster' FROM resources "
    "WHERE kind = 'Workload' AND NOT deleted "
    "AND status->>'state' IN ('Admitted', 'Running', 'Cancelling')"
)
EVENT_TYPES = (
    "WorkloadSubmitted",
    "WorkloadAdmitted",
    "WorkloadRunning",
    "WorkloadFinished",
    "WorkloadPreempted",
    "WorkloadEvicted",
    "WorkloadRequeued",
    "ClusterLost",
)
_PLACEMENTS = sa.text(
    "SELECT data->>'namespace', data->>'name', data->'status'->'admission' FROM events "
    "WHERE type = 'WorkloadAdmitted' ORDER BY position"
)
_EVENTS = sa.text(
    "SELECT type, data->>'namespace', data->>'name', data->'status'->'admission'->>'cluster', "
    "extract(epoch FROM recorded_at) FROM events WHERE type = ANY(:types) ORDER BY position"
)


def start_members(
    stack: Stack, fleet: Path, names: list[str], controllers: bool = True
) -> dict[str, Member]:
    """Each member a ``sim cluster`` process of its own at real time, as
    tests/workers/chaos_run.py starts its three."""
    (stack.workdir / "clusters").mkdir(parents=True, exist_ok=True)
    started = {}
    for name in names:
        kubeconfig = stack.workdir / "clusters" / f"{name}.kubeconfig"
        argv = [
            *(sys.executable, "-m", "sim.cli", "cluster", "--fleet", str(fleet)),
            *("--cluster", name, "--port", "0", "--time-scale", "1"),
            *("--kubeconfig-out", str(kubeconfig)),
            *(() if controllers else ("--no-controllers",)),
        ]
        started[name] = (stack.supervisor.start(f"member-{name}", argv), kubeconfig)
    members = {}
    for name, (child, kubeconfig) in started.items():

        def up(c: Child = child) -> bool:
            return "kubeconfig written" in c.output() or not c.alive

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


def execute(options: Options) -> Raw:
    with ExitStack() as exits:
        return _execute(options, exits)


def _up(o: Options, exits: ExitStack) -> tuple[Stack, dict[str, Member], str, Any, int]:
    """Postgres, Redis, the members, API, workers, scheduler; the quotas and
    Clusters through the API; returns once every member is Ready."""
    workdir = Path(exits.enter_context(tempfile.TemporaryDirectory(prefix="qm-kueue-perf-")))
    postgres = exits.enter_context(private_postgres(durable=True))
    admin = sa.create_engine(postgres.server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql("CREATE DATABASE qm")
    admin.dispose()
    url = postgres.url("qm")
    upgrade(url)
    redis_server = exits.enter_context(private_redis())
    stack = exits.enter_context(Stack(workdir, url, redis_server.url, {**ENV, **o.env}))
    nodes = node_count(o.config, o.capacity_factor)
    fleet = workdir / "fleet.yaml"
    fleet.write_text(fleet_yaml(o.config, o.members, nodes))
    members = start_members(
        stack, fleet, member_names(o.members), controllers=o.stand_ins == "controllers"
    )
    stack.start_services(o.api_processes, o.workers, o.worker_concurrency)
    objects = central_objects(o.config)
    with stack.client(timeout=120) as api:
        for obj in objects:
            stack.create(api, obj)
        registered = register_clusters(api, [m.stand_in for m in members.values()])
        assert not registered.failed, registered.failed
    stack.members = [m.stand_in for m in members.values()]
    wait_until(stack.clusters_ready, LONG_CEILING, "members Ready")
    o.say(f"up: {len(objects)} objects, {o.members} member(s), {nodes} nodes of 96 cpu")
    return stack, members, url, redis_server, nodes


def _execute(o: Options, exits: ExitStack) -> Raw:
    stack, members, url, redis_server, nodes = _up(o, exits)
    db = make_engine(url, pool_size=2)
    exits.callback(db.dispose)
    profilers = None
    if o.py_spy:
        directory = o.profile_dir or stack.workdir
        directory.mkdir(parents=True, exist_ok=True)
        profilers = Profilers(o.py_spy, directory)
        for child in stack.supervisor.children:
            profilers.start(child.name, child.pid)
    kubelets = None
    if o.stand_ins == "api":
        runtimes = {f"{a.namespace}/{a.name}": a.cls.runtime_ms / 1000 for a in arrivals(o.config)}
        kubelets = Kubelets(members.values(), runtimes, exits)
    generator = Generator(o.config, int(stack.api_url.rsplit(":", 1)[1]), o.connections)
    exits.callback(generator.stop)
    box = BoxCpu(db, redis_server.process.pid if redis_server.process else None)
    cpu_before = {c.name: _cpu_seconds(c.pid) for c in stack.supervisor.children}
    box_before = box.seconds()
    start = time.time() + 0.5
    generator.begin(start)
    o.say(f"generating {generator.count} workloads from {time.strftime('%H:%M:%S')}")
    watched = _watch(o, db, generator, members, start)
    cpu_after = {c.name: _cpu_seconds(c.pid) for c in stack.supervisor.children if c.alive}
    if watched.kill is not None:
        cpu_after[f"member-{watched.kill.member}"] = watched.kill.cpu_seconds
    box_after = box.seconds()
    profiles = profilers.stop() if profilers else {}
    o.say(f"ended {watched.ended - start:.1f} s after the start: collecting")
    with db.connect() as conn:
        events = [
            (str(t), str(ns), str(n), c, float(at))
            for t, ns, n, c, at in conn.execute(_EVENTS, {"types": list(EVENT_TYPES)})
        ]
        placements = _placements(conn) if o.config.topology is not None else []
    entries, ledger_problems = ledger_sound(db)
    controllers = o.stand_ins == "controllers"
    intervals = {name: m.intervals() for name, m in members.items() if controllers}
    seen = kubelets.jobs() if kubelets else []
    jobs = [(j.cluster, j.namespace, j.name, j.created) for j in seen]
    return Raw(
        options=o,
        start=start,
        answers=watched.answers,
        statuses=watched.statuses,
        ended=watched.ended,
        states=_states(db),
        cpu_before=cpu_before,
        cpu_after=cpu_after,
        box_before=box_before,
        box_after=box_after,
        events=events,
        entries=entries,
        intervals=intervals,
        jobs=jobs,
        placements=placements,
        racks=_racks(stack.workdir / "fleet.yaml") if placements else {},
        completions=kubelets.counts() if kubelets else {},
        ledger_problems=ledger_problems,
        kill=watched.kill,
        nodes=nodes,
        load_average=watched.load,
        profiles=profiles,
        finished_in_time=watched.finished,
    )


@dataclass
class _Watched:
    answers: list[Answer] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    kill: Kill | None = None
    load: list[tuple[float, float]] = field(default_factory=list)
    finished: bool = False
    ended: float = 0.0


def _watch(
    o: Options, db: sa.Engine, generator: Generator, members: dict[str, Member], start: float
) -> _Watched:
    """Until every acknowledged workload has finished (or the timeout):
    the generator's answers, the kill when due, progress every 10 s."""
    w = _Watched()
    answered = False
    said = 0.0
    while time.time() < start + o.timeout:
        if not answered and (result := generator.poll()) is not None:
            w.answers, w.statuses = result
            answered = True
        if o.kill_at is not None and w.kill is None and time.time() >= start + o.kill_at:
            w.kill = _kill_busiest(o, db, members)
            o.say(f"killed member {w.kill.member}: it held {len(w.kill.holding)} gangs")
        states = _states(db)
        acknowledged = sum(1 for a in w.answers if a.status == 201)
        if answered and states.get("Finished", 0) >= acknowledged:
            w.finished = True
            break
        if time.time() - said >= 10:
            said = time.time()
            w.load.append((round(said - start, 1), os.getloadavg()[0]))
            o.say(f"[{said - start:7.1f} s] {dict(sorted(states.items()))} load {w.load[-1][1]}")
        time.sleep(0.5)
    w.ended = time.time()
    if not answered:
        generator.stop()
        w.statuses = {"generator-unfinished": 1}
    return w


def _placements(conn: sa.Connection) -> list[tuple[str, str, list[list[str]]]]:
    out = []
    for namespace, name, admission in conn.execute(_PLACEMENTS):
        nodes = [
            [f"{admission['cluster']}/{spot['node']}" for spot in ps.get("placement") or ()]
            for ps in (admission or {}).get("podSetAssignments") or ()
        ]
        out.append((str(namespace), str(name), nodes))
    return out


def _racks(fleet: Path) -> dict[str, str]:
    """``cluster/node`` → its rack label, from the fleet file the stand-ins serve."""
    return {
        f"{n.cluster}/{n.name}": n.labels.get(RACK_LABEL, "")
        for n in load_fleet(fleet.read_text()).nodes()
    }


def _states(db: sa.Engine) -> dict[str, int]:
    with db.connect() as conn:
        return {str(s): int(n) for s, n in conn.execute(_STATES)}


def _kill_busiest(o: Options, db: sa.Engine, members: dict[str, Member]) -> Kill:
    """SIGKILL the member the centre holds the most gangs on, for good —
    once one holds some (between two waves of admissions none may)."""

    def holding() -> list[tuple[str, str]]:
        with db.connect() as conn:
            return [(str(k), str(c)) for k, c in conn.execute(_HOLDING)]

    held = wait_until(holding, LONG_CEILING, "a member holding gangs", interval=0.05)
    counts = Counter(c for _, c in held)
    name = max(members, key=lambda n: (counts[n], n))
    member = members[name]
    cpu = _cpu_seconds(member.child.pid)
    records = member.intervals() if o.stand_ins == "controllers" else []
    at = time.time()
    kill(member.child)
    # What it ran, as read just before: a pod running then ended at the kill.
    member.final = [{**r, "end": r["end"] or at} for r in records]
    member.killed_at = at
    return Kill(name, at, sorted(k for k, c in held if c == name), cpu)
