"""End to end: submissions through the API to jobs on the member clusters.

    flock /tmp/qm-bench.lock .venv/bin/python bench/e2e.py [--rates 50,200,500] [--seconds 60]

What runs is what standalone mode runs, each a process of its own
(tests/workers/stack.py): the API (``--api-processes`` uvicorn workers),
a Celery worker, the scheduler (outbox relay, admission leader, fleet loop)
and three stand-in member clusters (``quartermaster sim cluster``), over a
scratch database on the local Postgres (created and dropped here; or a
private ``pg_ctl`` cluster with ``--private-postgres``) and a private
``redis-server``. Quotas and the Cluster objects go in through the API.

The fleet: 3 clusters x 4 fabric islands x ``--nodes-per-island`` nodes of
8 GPUs; four teams' ClusterQueues share it in one cohort. Every workload is
one pod of one GPU, spread over the teams.

For each rate an open-loop generator (its own process, asyncio, keep-alive
connections) submits at that rate for ``--seconds``: each submission is
scheduled at start + i/rate and sent when its time comes (late if the API
is behind, which is then measured). A watch on every member's Jobs notes
when each job appears; the latency of a workload is from its submission's
201 to its job on a member. The members run only their API servers (no
simulated scheduler, kubelet or Kueue: on this 2-core machine their CEL
validation of Kueue status writes would be the bottleneck, not ours); the
bench plays their kubelet: each job is marked Complete ``--run-seconds``
after it appeared, so sync sees it finish, the quota is released and
reconcile removes the job, as in a steady state.

Reported per rate: submissions acknowledged per second, admitted workloads
per second end to end (jobs that appeared on members, over the time from the
first submission to the last job), latency p50/p99/max, and what was still
missing when the phase ended. Beside it, measured in the same run: the pure
engine admitting the same workloads on the same fleet (one admission cycle,
the snapshot built as the admission cycle builds it).

CPU per workload, over the phases and their drains: each of the stack's
processes (``cpu_ms_per_workload_in_phases``) and the rest of the box
(``box_cpu_ms_per_workload_in_phases``): the Postgres server (every backend;
on the shared local server other clients' queries count too, so read it on an
otherwise idle machine or with ``--private-postgres``), Redis, and this bench's
own generators, watches and kubelet.

``--fleets kueue,mixed`` measures the same phases twice in one run, on a
fresh set of processes each: the Kueue-only fleet, then one whose ``m1``
(the member the engine fills first) is a Volcano member (docs/volcano.md:
a Queue mirror, a PodGroup applied before each job); ``fleets`` in the
result sets their admitted/s, latency and jobs per member side by side.

Progress on stderr; one JSON line on stdout; ``--out`` also writes it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api import read_answer  # noqa: E402
from service.app.admission import WorkloadRow, workload_from_row  # noqa: E402
from service.app.bootstrap import make_engine  # noqa: E402
from service.app.migrate import upgrade  # noqa: E402
from service.domain.manifests import (  # noqa: E402
    WORKLOAD_CLASS_LABEL,
    cluster_queue_from_manifest,
    cohort_from_manifest,
    local_queue_from_manifest,
    resource_flavor_from_manifest,
    topology_from_manifest,
)
from service.engine import EngineConfig, Snapshot, admission_cycle  # noqa: E402
from sim.fleet import load_fleet  # noqa: E402
from tests.harness import postgres_server, scratch_database  # noqa: E402
from tests.workers.stack import (  # noqa: E402
    GPU,
    TOKEN,
    JobRecord,
    MemberWatch,
    Stack,
    base_manifests,
    local_queue,
    pod_template,
    private_postgres,
    private_redis,
    team_queue,
    write_fleet,
)

TEAMS = ("team-a", "team-b", "team-c", "team-d")
#: Knobs set deliberately for the run (the rest are the defaults).
ENV = {
    "QM_MEMBER_QPS": "1000",  # per member cluster; client-go's 5 capped MultiKueue (kueue#8564)
    "QM_MEMBER_BURST": "2000",
    "QM_RATE_LIMIT_PER_SECOND": "100000",  # per principal: the bench is one principal
    "QM_RATE_LIMIT_BURST": "100000",
    # The stand-ins run no Kueue here, whose Workload updates would wake sync
    # the moment a job finishes: a resync every second stands in for them.
    "QM_RESYNC_INTERVAL": "1",
    "QM_CLUSTER_LEASE": "300",
    "QM_HEARTBEAT_INTERVAL": "10",
    "QM_DB_POOL_SIZE": "16",
}


def log(message: str) -> None:
    print(f"[bench/e2e {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def workload(name: str, team: str) -> dict[str, Any]:
    template = pod_template({"cpu": "1", "memory": "8Gi", GPU: "1"})
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "queueName": "train",
            "podSets": [{"name": "workers", "count": 1, "template": template}],
        },
    }


def manifests(gpus_per_team: int) -> list[dict[str, Any]]:
    out = [*base_manifests()]
    out += [team_queue(t, gpus_per_team, preemption={}) for t in TEAMS]
    out += [local_queue(t, t) for t in TEAMS]
    return out


# -- the load generator (a process of its own) --------------------------------------------------


def _post(name: str, team: str, port: int) -> bytes:
    body = json.dumps(workload(name, team), separators=(",", ":")).encode()
    head = (
        f"POST /v1/namespaces/{team}/workloads HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _open_loop(
    port: int, tag: str, rate: float, seconds: float, connections: int
) -> list[tuple[str, str, float, float, int]]:
    """Submit ``rate`` per second for ``seconds``; returns (namespace, name,
    scheduled wall time, answered wall time, status) per submission sent.
    Submissions still queued 5 s after the window (the API answering slower
    than the rate) are not sent: the phase ends on time."""
    total = int(rate * seconds)
    start = time.time() + 0.5
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)
    out: list[tuple[str, str, float, float, int]] = []

    stop = start + seconds + 5.0  # what the API could not take by then is not sent

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while not queue.empty() and time.time() < stop:
                i = queue.get_nowait()
                due = start + i / rate
                if (wait := due - time.time()) > 0:
                    await asyncio.sleep(wait)
                team, name = TEAMS[i % len(TEAMS)], f"{tag}-{i:06d}"
                writer.write(_post(name, team, port))
                status = await read_answer(reader)
                out.append((team, name, due, time.time(), int(status.split()[1])))
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return out


def _generator(
    port: int, tag: str, rate: float, seconds: float, connections: int, out: Any
) -> None:
    out.put(asyncio.run(_open_loop(port, tag, rate, seconds, connections)))


# -- the members' kubelet: jobs complete after a while ------------------------------------------


class Completer:
    """Marks each job Complete ``after`` seconds after it appeared (what a
    member's kubelet, job controller and Kueue would report)."""

    def __init__(self, kubeconfig: Path, clusters: list[str], after: float, threads: int = 4):
        self.after = after
        self.heap: list[tuple[float, str, str, str]] = []
        self.lock = threading.Condition()
        self.stop = threading.Event()
        self.completed = 0
        self.failed = 0
        new_client: Any = kubernetes.config.new_client_from_config
        self.apis = {
            c: [
                kubernetes.client.BatchV1Api(new_client(config_file=str(kubeconfig), context=c))
                for _ in range(threads)
            ]
            for c in clusters
        }
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)
        ]
        for thread in self.threads:
            thread.start()

    def add(self, job: JobRecord) -> None:
        with self.lock:
            heapq.heappush(
                self.heap, (job.created + self.after, job.cluster, job.namespace, job.name)
            )
            self.lock.notify()

    def _run(self, index: int) -> None:
        while not self.stop.is_set():
            with self.lock:
                while not self.stop.is_set() and (not self.heap or self.heap[0][0] > time.time()):
                    self.lock.wait(0.05 if self.heap else 0.5)
                if self.stop.is_set():
                    return
                _, cluster, namespace, name = heapq.heappop(self.heap)
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            status = {
                "status": {
                    "startTime": now,
                    "completionTime": now,
                    "succeeded": 1,
                    "conditions": [
                        {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                        {"type": "Complete", "status": "True", "lastTransitionTime": now},
                    ],
                }
            }
            try:
                answer = self.apis[cluster][index].patch_namespaced_job_status(
                    name, namespace, status, _preload_content=False
                )
                # Read to the end, so that the connection goes back to the pool:
                # left unread, every completion opened a new TLS connection (a
                # handshake on both sides, which the stand-ins' CPU counted).
                answer.data  # noqa: B018
                answer.release_conn()
                self.completed += 1
            except Exception:
                self.failed += 1

    def close(self) -> None:
        self.stop.set()
        with self.lock:
            self.lock.notify_all()
        for thread in self.threads:
            thread.join(5)


# -- one phase ---------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 3)


_ADMITTED = sa.text(
    "SELECT data->>'namespace', data->>'name', min(extract(epoch FROM recorded_at)) "
    "FROM events WHERE type = 'WorkloadAdmitted' AND data->>'name' LIKE :tag GROUP BY 1, 2"
)


def _split(
    database: sa.Engine,
    tag: str,
    acknowledged: dict[tuple[str, str], float],
    seen: dict[tuple[str, str], float],
) -> dict[str, float | None]:
    """Where the latency goes: 201 to the admission's commit, and that
    commit to the job on a member (Postgres's clock and ours are one)."""
    with database.connect() as conn:
        admitted = {
            (ns, n): float(at) for ns, n, at in conn.execute(_ADMITTED, {"tag": tag + "-%"})
        }
    to_admit = [max(0.0, a - acknowledged[k]) for k, a in admitted.items() if k in acknowledged]
    to_job = [max(0.0, seen[k] - a) for k, a in admitted.items() if k in seen]
    return {
        "to_admission_p50_s": _percentile(to_admit, 0.5),
        "to_admission_p99_s": _percentile(to_admit, 0.99),
        "admission_to_job_p50_s": _percentile(to_job, 0.5),
        "admission_to_job_p99_s": _percentile(to_job, 0.99),
    }


def phase(
    stack: Stack,
    watch: MemberWatch,
    database: sa.Engine,
    rate: float,
    seconds: float,
    drain: float,
    connections: int,
) -> dict[str, Any]:
    tag = f"r{int(rate)}"
    port = int(stack.api_url.rsplit(":", 1)[1])
    context = mp.get_context("spawn")
    queue: Any = context.Queue()
    generator = context.Process(
        target=_generator, args=(port, tag, rate, seconds, connections, queue), daemon=True
    )
    began = time.time()
    generator.start()
    answers: list[tuple[str, str, float, float, int]] = queue.get(timeout=seconds * 10 + 120)
    generator.join(10)
    ended = time.time()
    acknowledged = {
        (ns, name): answered for ns, name, _, answered, status in answers if status == 201
    }
    refused: dict[int, int] = {}
    for *_, status in answers:
        if status != 201:
            refused[status] = refused.get(status, 0) + 1
    late = [answered - due for _, _, due, answered, _ in answers]

    def on_member() -> dict[tuple[str, str], float]:
        with watch.lock:
            return {
                (j.namespace, j.name): j.created
                for j in watch.job_history
                if j.name.startswith(tag + "-")
            }

    def by_cluster() -> dict[str, int]:
        with watch.lock:
            named = [j.cluster for j in watch.job_history if j.name.startswith(tag + "-")]
        return {c: named.count(c) for c in sorted(set(named))}

    at_end = len(on_member())
    deadline = time.time() + drain
    while len(on_member()) < len(acknowledged) and time.time() < deadline:
        time.sleep(0.5)
    seen = on_member()
    latencies = [max(0.0, seen[k] - t) for k, t in acknowledged.items() if k in seen]
    first = min((due for _, _, due, _, _ in answers), default=began)
    last_job = max(seen.values(), default=ended)
    result = {
        "rate": rate,
        "seconds": seconds,
        "scheduled": int(rate * seconds),
        "submitted": len(answers),
        "acknowledged": len(acknowledged),
        "refused": refused,
        "acknowledged_per_s": round(len(acknowledged) / max(1e-9, ended - first), 1),
        "answer_p50_s": _percentile(late, 0.5),
        "answer_p99_s": _percentile(late, 0.99),
        "on_member": len(seen),
        "missing_at_phase_end": len(acknowledged) - at_end,
        "missing_after_drain": len(acknowledged) - len(seen),
        "admitted_per_s_end_to_end": round(len(seen) / max(1e-9, last_job - first), 1),
        "latency_p50_s": _percentile(latencies, 0.5),
        "latency_p99_s": _percentile(latencies, 0.99),
        "latency_max_s": _percentile(latencies, 1.0),
        **_split(database, tag, acknowledged, seen),
        "jobs_by_cluster": by_cluster(),
    }
    log(f"rate {rate}/s: {json.dumps(result)}")
    return result


# -- the engine alone, same workloads, same fleet -----------------------------------------------


def engine_only(fleet_text: str, objects: list[dict[str, Any]], count: int) -> dict[str, Any]:
    """One admission cycle with ``count`` of the bench's workloads pending on
    an empty fleet: the engine's admission rate for the same workload."""
    fleet = load_fleet(fleet_text)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)

    def meta(obj: dict[str, Any]) -> dict[str, Any]:
        # As the admission cycle reads them (service/app/admission/__init__.py).
        labels = {WORKLOAD_CLASS_LABEL: "training"} if obj["kind"] == "ClusterQueue" else {}
        return {"metadata": {**obj["metadata"], "labels": labels}, "spec": obj["spec"]}

    now = datetime.now(UTC)
    pending = [
        workload_from_row(
            WorkloadRow(
                team, f"w{i}", f"uid-{i}", 1, 1, {}, {}, workload("w", team)["spec"], {}, now
            )
        )
        for i in range(count)
        for team in (TEAMS[i % len(TEAMS)],)
    ]
    snapshot = Snapshot(
        cluster_queues=[cluster_queue_from_manifest(meta(o)) for o in by_kind["ClusterQueue"]],
        resource_flavors=[
            resource_flavor_from_manifest(meta(o)) for o in by_kind["ResourceFlavor"]
        ],
        cohorts=[cohort_from_manifest(meta(o)) for o in by_kind["Cohort"]],
        local_queues=[local_queue_from_manifest(meta(o)) for o in by_kind["LocalQueue"]],
        priority_classes=[],
        topologies=[topology_from_manifest(meta(o)) for o in by_kind["Topology"]],
        clusters=[c.cluster for c in fleet.clusters],
        nodes=list(fleet.nodes()),
        admitted=[],
        pending=pending,
        namespaces={t: {"kubernetes.io/metadata.name": t} for t in TEAMS},
        local_queue_usage={},
        config=EngineConfig(),
    )
    runs = []
    for _ in range(3):
        gc.collect()
        began = time.perf_counter()
        result = admission_cycle(snapshot, time.time())
        runs.append((time.perf_counter() - began, len(result.admissions)))
    seconds, admitted = min(runs)
    return {
        "pending": count,
        "admitted": admitted,
        "cycle_s": round(seconds, 3),
        "admitted_per_s": round(admitted / seconds, 1),
    }


# -- the run -----------------------------------------------------------------------------------


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rates", default="50,200,500")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--drain", type=float, default=30.0, help="wait for late jobs (s)")
    parser.add_argument("--run-seconds", type=float, default=1.0, help="each job runs this long")
    parser.add_argument("--nodes-per-island", type=int, default=32)
    parser.add_argument("--api-processes", type=int, default=2)
    parser.add_argument("--worker-concurrency", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--private-postgres", action="store_true")
    parser.add_argument(
        "--fleets",
        default="kueue",
        help="fleets measured one after the other in this run: kueue (three Kueue members), "
        "mixed (m1, which the engine fills first, a Volcano member); e.g. kueue,mixed",
    )
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def _database(stack: ExitStack, private: bool) -> str:
    if private:
        server_url = stack.enter_context(private_postgres()).server_url
    else:
        server_url = stack.enter_context(postgres_server(stack))
    database = stack.enter_context(scratch_database(server_url, "bench_e2e"))
    upgrade(database)
    return database


#: The members' backends of each fleet ``--fleets`` names.
#: The engine fills m1 first, so in "mixed" the Volcano member takes most gangs.
FLEETS = {"kueue": {}, "mixed": {"m1": "volcano"}}


def measure(args: argparse.Namespace, backends: dict[str, str] | None = None) -> dict[str, Any]:
    """Every phase against one set of processes; the engine alone after.
    ``backends``: members that are not Kueue members (``{"m3": "volcano"}``)."""
    started = time.time()
    gpus = 3 * 4 * args.nodes_per_island * 8
    objects = manifests(gpus // len(TEAMS))
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="qm-bench-e2e-")))
        redis_server = stack.enter_context(private_redis())
        database = _database(stack, args.private_postgres)
        fleet = write_fleet(
            workdir / "fleet.yaml",
            {f"m{i}": (4, args.nodes_per_island) for i in (1, 2, 3)},
            backends,
        )
        fleet_text = fleet.read_text()
        log(
            f"fleet: 3 clusters ({backends or 'all kueue'}), {gpus} GPUs; "
            f"database {database.rsplit('/', 1)[1]}"
        )
        env = {**ENV, **json.loads(os.environ.get("QM_BENCH_EXTRA_ENV", "{}"))}
        processes = stack.enter_context(Stack(workdir, database, redis_server.url, env))
        processes.start(
            fleet,
            3,
            objects,
            time_scale=1.0,
            concurrency=args.worker_concurrency,
            api_processes=args.api_processes,
            controllers=False,
        )
        log(f"up in {time.time() - started:.1f} s")
        watch = stack.enter_context(MemberWatch(processes.members, processes.kubeconfig))
        completer = Completer(
            processes.kubeconfig, [m.name for m in processes.members], args.run_seconds
        )
        stack.callback(completer.close)
        watch.on_job = completer.add
        db = make_engine(database, pool_size=1)
        stack.callback(db.dispose)
        phases = []
        cpu_before = {c.name: _cpu_seconds(c.pid) for c in processes.supervisor.children}
        box = BoxCpu(db, redis_server.process.pid if redis_server.process else None)
        box_before = box.seconds()
        for rate in (float(r) for r in args.rates.split(",")):
            log(f"submitting {rate:g}/s for {args.seconds:g} s…")
            phases.append(
                phase(processes, watch, db, rate, args.seconds, args.drain, args.connections)
            )
        cpu = {c.name: _cpu_seconds(c.pid) for c in processes.supervisor.children}
        box_after = box.seconds()
        cycles = processes.metric("qm_admission_cycle_duration_seconds_count") or 0.0
        cycle_seconds = processes.metric("qm_admission_cycle_duration_seconds_sum") or 0.0
        with db.connect() as conn:
            events: dict[str, int] = dict(
                conn.execute(sa.text("SELECT type, count(*) FROM events GROUP BY 1")).all()
            )
        completed = {"completed": completer.completed, "failed": completer.failed}
        processes.stop()
    log("the engine alone…")
    count = next((p["acknowledged"] for p in phases if p["rate"] == 200), phases[0]["acknowledged"])
    engine = engine_only(fleet_text, objects, min(count, gpus))
    log(f"engine: {engine}")
    submitted = sum(p["acknowledged"] for p in phases)
    return {
        "fleet_gpus": gpus,
        "phases": phases,
        "engine_only": engine,
        "cpu_seconds": cpu,
        "cpu_ms_per_workload": {k: round(1000 * v / max(1, submitted), 2) for k, v in cpu.items()},
        # Without start-up (imports, migrations, seeding): the phases and their drains.
        "cpu_ms_per_workload_in_phases": {
            k: round(1000 * (v - cpu_before.get(k, 0.0)) / max(1, submitted), 2)
            for k, v in cpu.items()
        },
        # The rest of what the 2 cores did meanwhile: Postgres (the whole
        # server: on the shared local one, other clients' queries too),
        # Redis, and this bench (its generators, member watches and kubelet).
        "box_cpu_ms_per_workload_in_phases": {
            k: round(1000 * (box_after[k] - box_before[k]) / max(1, submitted), 2)
            for k in box_after
        },
        "admission_cycles": {
            "cycles": int(cycles),
            "mean_s": round(cycle_seconds / max(1.0, cycles), 4),
            "workloads_per_cycle": round(submitted / max(1.0, cycles), 1),
        },
        "events_written": events,
        "jobs_completed_by_the_bench": completed,
    }


def main() -> None:
    args = _arguments()
    load_before = os.getloadavg()
    names = [n.strip() for n in args.fleets.split(",") if n.strip()]
    unknown = [n for n in names if n not in FLEETS]
    if unknown or not names:
        raise SystemExit(f"--fleets: {unknown or names} not of {sorted(FLEETS)}")
    runs = {name: measure(args, FLEETS[name]) for name in names}
    measured = runs[names[0]]
    at_200 = next((p for p in measured["phases"] if p["rate"] == 200), None)
    beside: dict[str, Any] = {}
    if len(runs) > 1:
        # Each fleet's phases, side by side: admitted/s and p99 per rate.
        beside["fleets"] = {
            name: {
                "backends": FLEETS[name] or "all kueue",
                "phases": [
                    {
                        k: p[k]
                        for k in (
                            "rate",
                            "acknowledged",
                            "admitted_per_s_end_to_end",
                            "latency_p50_s",
                            "latency_p99_s",
                            "missing_after_drain",
                            "jobs_by_cluster",
                        )
                    }
                    for p in run["phases"]
                ],
                "cpu_ms_per_workload_in_phases": run["cpu_ms_per_workload_in_phases"],
            }
            for name, run in runs.items()
        }
    result = {
        "bench": "e2e",
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds_per_rate": args.seconds,
        "run_seconds": args.run_seconds,
        "api_processes": args.api_processes,
        "worker_concurrency": args.worker_concurrency,
        "postgres": "private (fsync off)" if args.private_postgres else "local 127.0.0.1:5432",
        **measured,
        "targets": {
            "admitted_per_s_at_200": at_200 and at_200["admitted_per_s_end_to_end"],
            "p99_s_at_200": at_200 and at_200["latency_p99_s"],
            "met": bool(
                at_200
                and at_200["admitted_per_s_end_to_end"] >= 200 * 0.98
                and (at_200["latency_p99_s"] or 99) <= 3.0
            ),
        },
        **beside,
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }
    line = json.dumps(result)
    print(line)
    if args.out:
        args.out.write_text(line + "\n")


class BoxCpu:
    """CPU seconds of what runs beside the stack's own processes."""

    def __init__(self, db: sa.Engine, redis_pid: int | None) -> None:
        import psutil

        with db.connect() as conn:
            backend = int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
        # Backends are the postmaster's children: it accrues those that
        # exited (children_user/system), the live ones are counted apiece.
        self._postmaster = psutil.Process(backend).parent()
        self._redis = psutil.Process(redis_pid) if redis_pid else None
        self._self = psutil.Process()

    def seconds(self) -> dict[str, float]:
        import psutil

        def own(process: psutil.Process | None) -> float:
            if process is None:
                return 0.0
            try:
                return float(sum(process.cpu_times()[:2]))
            except psutil.Error:
                return 0.0

        postgres = 0.0
        if self._postmaster is not None:
            times = self._postmaster.cpu_times()
            postgres = float(sum(times[:4])) + sum(
                own(c) for c in self._postmaster.children(recursive=True)
            )
        # This process's threads and its reaped children (each phase's
        # generator), not the stack's processes (counted apiece above).
        times = self._self.cpu_times()
        return {
            "postgres": postgres,
            "redis": own(self._redis),
            "bench": float(sum(times[:2])) + float(times.children_user + times.children_system),
        }


def _cpu_seconds(pid: int) -> float:
    """CPU time of a child and its descendants (a Celery worker's pool)."""
    import psutil

    try:
        process = psutil.Process(pid)
        total = float(sum(process.cpu_times()[:2]))
        for child in process.children(recursive=True):
            total += float(sum(child.cpu_times()[:2]))
        return round(total, 1)
    except psutil.Error:
        return -1.0


if __name__ == "__main__":
    main()
