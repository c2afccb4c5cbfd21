"""Submissions through the REST API against a bare-INSERT baseline.

    .venv/bin/python bench/api.py [--seconds 5] [--clients 16,64,256]

Starts ``uvicorn service.api.main:create`` with 2 workers on loopback over a
scratch database, and, as the baseline in the same run, a bare endpoint
(``bench/api.py bare``: Starlette, one raw INSERT of the same JSON payload
through a psycopg pool) also with 2 workers. A load generator of 2 processes
of asyncio keep-alive connections (a minimal HTTP/1.1 client, so that the
generator costs little CPU on a 2-core machine) posts unique submissions for
``--seconds`` per concurrency, the baseline and then the API for each
concurrency in turn (both servers are up throughout). Then the bulk endpoint:
5,000 workloads per request. Besides rates and latencies, each figure carries
the CPU that the server's processes and the database's backends spent per
request (``server_cpu_us``, ``database_cpu_us``), which moves far less than
the rates with whatever else runs on the box, and the run carries the load
average at its start and end. Prints one JSON line; progress goes to stderr.
The submissions carry no Idempotency-Key; ``--keyed 64`` adds a run at 64
clients in which each one does (its own key).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.runtime.embedded import free_port  # noqa: E402

TOKEN = "bench-admin-token"
DIGEST = "registry.example/train@sha256:" + "c" * 64


def log(message: str) -> None:
    print(f"[bench/api] {message}", file=sys.stderr, flush=True)


def workload(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "queueName": "train",
            "podSets": [
                {
                    "name": "workers",
                    "count": 8,
                    "template": {
                        "spec": {
                            "serviceAccountName": "trainer",
                            "runtimeClassName": "nvidia",
                            "securityContext": {
                                "runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                            "containers": [
                                {
                                    "name": "main",
                                    "securityContext": {
                                        "allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"]},
                                    },
                                    "image": DIGEST,
                                    "resources": {"requests": {"cpu": "8", "nvidia.com/gpu": 8}},
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


# -- the baseline: one raw INSERT per request --------------------------------------------


def bare_app() -> Any:
    from psycopg.types.json import Jsonb
    from psycopg_pool import ConnectionPool
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    url = os.environ["BENCH_DSN"]
    pool = ConnectionPool(url, min_size=4, max_size=10, open=True)

    def insert(body: Any) -> None:
        with pool.connection() as conn:
            conn.execute("INSERT INTO bench_bare (body) VALUES (%s)", (Jsonb(body),))

    async def submit(request: Request) -> JSONResponse:
        from anyio import to_thread

        body = json.loads(await request.body())
        await to_thread.run_sync(insert, body)
        return JSONResponse(body, status_code=201)

    return Starlette(routes=[Route("/submit", submit, methods=["POST"])])


# -- servers -----------------------------------------------------------------------------


@contextmanager
def server(
    args: list[str], env: dict[str, str], port: int, ready: str
) -> Iterator[tuple[str, int]]:
    """The server's base URL and its process group (uvicorn and its workers)."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            *args,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "2",
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env={**os.environ, **env},
        cwd=ROOT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + ready, timeout=1).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"server {args} did not start")
            time.sleep(0.2)
        yield base, process.pid
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# -- CPU accounting ----------------------------------------------------------------------
# Other work shares the box: requests per second move with it, CPU per request
# much less. So each run also says how much CPU the server's processes and the
# database's backends spent per request.


def _proc_cpu(match: Callable[[str, str], bool]) -> float:
    """CPU seconds (user + system) of the processes ``match(stat, cmdline)`` picks."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if match(stat, cmdline):
            fields = stat.rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / tick


def server_cpu(group: int) -> float:
    return _proc_cpu(lambda stat, _: int(stat.rsplit(")", 1)[1].split()[2]) == group)


def database_cpu(database: str) -> float:
    return _proc_cpu(lambda _, cmdline: cmdline.startswith("postgres:") and database in cmdline)


# -- load generator ----------------------------------------------------------------------


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    """Read one HTTP/1.1 answer to its end (by Content-Length); its status line."""
    status_line = await reader.readline()
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return status_line


def _request(path: str, body: bytes, port: int, key: str | None = None) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        + (f"Idempotency-Key: {key}\r\n" if key else "")
        + f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _connection(
    port: int,
    path: str,
    prefix: str,
    stop: float,
    latencies: list[float],
    errors: list[int],
    keyed: bool,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    template = json.dumps(workload("NAME"), separators=(",", ":"))
    counter = 0
    try:
        while time.perf_counter() < stop:
            counter += 1
            body = template.replace("NAME", f"{prefix}-{counter}").encode()
            start = time.perf_counter()
            key = f"{prefix}-{counter}" if keyed else None
            writer.write(_request(path, body, port, key))
            status_line = await read_answer(reader)
            latencies.append(time.perf_counter() - start)
            if not status_line.startswith(b"HTTP/1.1 201"):
                errors.append(int(status_line.split()[1]))
    finally:
        writer.close()


def _generator(
    port: int, path: str, clients: int, seconds: float, tag: str, keyed: bool, out: Any
) -> None:
    latencies: list[float] = []
    errors: list[int] = []

    async def main() -> None:
        stop = time.perf_counter() + seconds
        await asyncio.gather(
            *(
                _connection(port, path, f"{tag}-{i}", stop, latencies, errors, keyed)
                for i in range(clients)
            )
        )

    asyncio.run(main())
    out.put((latencies, errors))


def load(
    port: int,
    path: str,
    clients: int,
    seconds: float,
    tag: str,
    group: int,
    database: str,
    keyed: bool = False,
) -> dict[str, Any]:
    processes = 2
    queue: Any = mp.get_context("spawn").Queue()
    workers = [
        mp.get_context("spawn").Process(
            target=_generator,
            args=(port, path, clients // processes, seconds, f"{tag}-p{p}", keyed, queue),
        )
        for p in range(processes)
    ]
    started = time.perf_counter()
    cpu = server_cpu(group), database_cpu(database)
    for worker in workers:
        worker.start()
    latencies: list[float] = []
    errors: list[int] = []
    for _ in workers:
        got, failed = queue.get()
        latencies += got
        errors += failed
    spent = server_cpu(group) - cpu[0], database_cpu(database) - cpu[1]
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    latencies.sort()
    ok = len(latencies) - len(errors)
    return {
        "per_s": round(ok / seconds, 1),
        "requests": len(latencies),
        "errors": len(errors),
        "error_codes": sorted(set(errors)),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 2) if latencies else None,
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 2) if latencies else None,
        "mean_ms": round(1000 * statistics.fmean(latencies), 2) if latencies else None,
        "wall_s": round(elapsed, 2),
        "server_cpu_us": round(1e6 * spent[0] / max(len(latencies), 1)),
        "database_cpu_us": round(1e6 * spent[1] / max(len(latencies), 1)),
    }


# -- the run -----------------------------------------------------------------------------


def prepare(base: str) -> None:
    admin = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    flavor = {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"sku": "h100"}}}
    resources = [
        {"name": "cpu", "nominalQuota": 100000},
        {"name": "nvidia.com/gpu", "nominalQuota": 100000},
    ]
    groups = [
        {
            "coveredResources": ["cpu", "nvidia.com/gpu"],
            "flavors": [{"name": "h100", "resources": resources}],
        }
    ]
    for path, body in (
        ("/v1/resourceflavors", flavor),
        ("/v1/clusterqueues", {"metadata": {"name": "cq"}, "spec": {"resourceGroups": groups}}),
        (
            "/v1/namespaces/bench/localqueues",
            {"metadata": {"name": "train"}, "spec": {"clusterQueue": "cq"}},
        ),
    ):
        response = admin.post(path, json=body)
        assert response.status_code == 201, response.text


def bulk(base: str, batches: int, group: int, database: str, size: int = 5000) -> dict[str, Any]:
    client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300)
    # The bodies are encoded before the clock starts: the client's JSON
    # encoding (stdlib, ~3.5 MB a request) ran on the same two cores.
    bodies = [
        json.dumps({"items": [workload(f"bulk-{b}-{i}") for i in range(size)]}).encode()
        for b in range(batches)
    ]
    headers = {"Content-Type": "application/json"}
    created, started = 0, time.perf_counter()
    cpu = server_cpu(group), database_cpu(database)
    for b, body in enumerate(bodies):
        response = client.post("/v1/namespaces/bench/bulk/workloads", content=body, headers=headers)
        assert response.status_code == 200, response.text[:300]
        created += response.json()["created"]
        log(f"bulk {b + 1}/{batches}: {created} workloads")
    elapsed = time.perf_counter() - started
    spent = server_cpu(group) - cpu[0], database_cpu(database) - cpu[1]
    return {
        "workloads_per_s": round(created / elapsed, 1),
        "batches": batches,
        "batch_size": size,
        "server_cpu_us": round(1e6 * spent[0] / max(created, 1)),
        "database_cpu_us": round(1e6 * spent[1] / max(created, 1)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", default="run")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", default="16,64,256")
    parser.add_argument("--bulk-batches", type=int, default=4)
    parser.add_argument(
        "--keyed",
        default="",
        help="client counts at which the API is also measured with an Idempotency-Key per "
        "submission (e.g. 64); none by default",
    )
    parser.add_argument("--server", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    from service.app.migrate import upgrade
    from tests.harness import scratch_database

    with scratch_database(args.server, "bench_api") as url:
        upgrade(url)
        import sqlalchemy as sa
        from sqlalchemy.engine import make_url

        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE bench_bare (id bigserial PRIMARY KEY, body jsonb NOT NULL)"
            )
        engine.dispose()
        dsn = url.replace("postgresql+psycopg://", "postgresql://")
        env = {
            "QM_DATABASE_URL": url,
            "QM_BOOTSTRAP_TOKEN": TOKEN,
            "QM_RATE_LIMIT_PER_SECOND": "1000000",
            "QM_RATE_LIMIT_BURST": "1000000",
            "QM_MAX_BODY_BYTES": str(64 << 20),
            "BENCH_DSN": dsn,
        }
        clients = [int(c) for c in args.clients.split(",")]
        results: dict[str, Any] = {
            "bench": "api",
            "seconds": args.seconds,
            "workers": 2,
            "single": {},
        }
        database = make_url(url).database or ""
        results["load_average"] = {"start": [round(x, 2) for x in os.getloadavg()]}
        bare_port, api_port = free_port(), free_port()
        # Both servers up at once, and each concurrency measured for the
        # baseline and then the API, back to back: the box's other load moves
        # both sides of a ratio alike.
        with (
            server(["bench.api:bare_app", "--factory"], env, bare_port, "/nothing") as (_, bare),
            server(["service.api.main:create", "--factory"], env, api_port, "/readyz") as (
                base,
                group,
            ),
        ):
            prepare(base)
            for n in clients:
                log(f"baseline (bare INSERT), {n} clients ...")
                baseline = load(bare_port, "/submit", n, args.seconds, f"bare{n}", bare, database)
                log(f"API submissions, {n} clients ...")
                path = "/v1/namespaces/bench/workloads"
                api = load(api_port, path, n, args.seconds, f"api{n}", group, database)
                ratio = round(api["per_s"] / max(baseline["per_s"], 1e-9), 3)
                results["single"][str(n)] = {"baseline": baseline, "api": api, "ratio": ratio}
                log(
                    f"  {api['per_s']}/s p99 {api['p99_ms']} ms vs baseline {baseline['per_s']}/s"
                    f" (server CPU {api['server_cpu_us']} vs {baseline['server_cpu_us']} us"
                    " per request)"
                )
            for n in [int(c) for c in args.keyed.split(",") if c]:
                log(f"API submissions with an Idempotency-Key each, {n} clients ...")
                path = "/v1/namespaces/bench/workloads"
                keyed = load(api_port, path, n, args.seconds, f"key{n}", group, database, True)
                results.setdefault("keyed", {})[str(n)] = keyed
                log(f"  {keyed['per_s']}/s p99 {keyed['p99_ms']} ms")
            results["bulk"] = bulk(base, args.bulk_batches, group, database)
        results["load_average"]["end"] = [round(x, 2) for x in os.getloadavg()]
        results["targets"] = {
            "single_per_s_at_64": ">= 1500",
            "p99_ms_at_64": "<= 50",
            "bulk_workloads_per_s": ">= 20000",
            "ratio": ">= 0.5",
        }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
