"""The web console's pages with 100,000 workloads, beside the API's own calls.

    flock /tmp/qm-bench.lock .venv/bin/python bench/console.py [--workloads 100000] [--rounds 300]

Starts ``uvicorn service.api.main:create`` (2 workers, as bench/api.py) over
a scratch database and fills it through the real submission path: the bulk
endpoint (``POST /v1/namespaces/bench/bulk/workloads``, 5,000 a request).
Then, signed in through the console's own form, one client on loopback asks
in turn, one request at a time on a keep-alive connection:

* ``console_list``: the Workloads page (``/ui/workloads?namespace=bench``, 50 rows)
* ``console_rows``: its rows fragment, what a live update fetches
* ``console_filtered``: the page filtered by queue and state
* ``console_workload``: a workload's page (a random one of the 100,000)
* ``api_list``: the equivalent API call, ``GET /v1/namespaces/bench/workloads?limit=50``
* ``api_workload``: ``GET /v1/namespaces/bench/workloads/<name>``, the same random ones

in blocks of ``--block`` requests of one kind, the kinds taking turns, so
that the box's other load falls on all of them alike. Per kind: the time
from request to the answer's last byte at the client (p50, p99, mean), the
bytes transferred (body and headers), and the CPU the server's processes and
the database's backends spent per request (which moves far less than times
do with whatever else runs on the box). One JSON line on stdout (``--out``
also writes it); progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api import TOKEN, database_cpu, prepare, server, server_cpu, workload  # noqa: E402
from service.runtime.embedded import free_port  # noqa: E402

BATCH = 5000
KINDS = (
    "console_list",
    "console_rows",
    "console_filtered",
    "console_workload",
    "api_list",
    "api_workload",
)


def log(message: str) -> None:
    print(f"[bench/console] {message}", file=sys.stderr, flush=True)


def fill(base: str, count: int) -> list[str]:
    """``count`` workloads through the bulk endpoint; their names."""
    client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=600)
    names: list[str] = []
    started = time.perf_counter()
    for batch in range((count + BATCH - 1) // BATCH):
        chunk = [f"wl-{batch}-{i}" for i in range(min(BATCH, count - batch * BATCH))]
        body = json.dumps({"items": [workload(n) for n in chunk]}).encode()
        answer = client.post(
            "/v1/namespaces/bench/bulk/workloads",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["created"] == len(chunk), answer.text[:300]
        names += chunk
        log(f"{len(names)} workloads")
    log(f"filled in {time.perf_counter() - started:.1f} s")
    return names


def console_session(base: str) -> dict[str, str]:
    """The Cookie header of a console session, signed in through its form
    (by hand: httpx sends no Secure cookie over plain HTTP)."""
    form = httpx.get(base + "/ui/signin", timeout=30)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert csrf is not None, form.text
    jar = "; ".join(c.split(";")[0] for c in form.headers.get_list("set-cookie"))
    answer = httpx.post(
        base + "/ui/signin",
        data={"token": TOKEN, "csrf_token": csrf.group(1), "next": "/ui/workloads"},
        headers={"cookie": jar},
        timeout=30,
    )
    assert answer.status_code == 303, answer.text
    session = next(
        c.split(";")[0]
        for c in answer.headers.get_list("set-cookie")
        if c.startswith("qm_console=")
    )
    return {"cookie": session}


def paths(kind: str, name: str) -> str:
    return {
        "console_list": "/ui/workloads?namespace=bench",
        "console_rows": "/ui/workloads/rows?namespace=bench",
        "console_filtered": "/ui/workloads?namespace=bench&queue=train&state=Pending",
        "console_workload": f"/ui/workloads/bench/{name}",
        "api_list": "/v1/namespaces/bench/workloads?limit=50",
        "api_workload": f"/v1/namespaces/bench/workloads/{name}",
    }[kind]


def measure(
    base: str, names: list[str], rounds: int, block: int, group: int, database: str
) -> dict[str, Any]:
    console = httpx.Client(base_url=base, headers=console_session(base), timeout=60)
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    picked = random.Random(20).choices(names, k=rounds * len(KINDS))
    seen: dict[str, dict[str, list[float]]] = {
        k: {"s": [], "body": [], "headers": [], "cpu": [], "db": []} for k in KINDS
    }
    warm = [api.get(paths("api_list", "")), console.get(paths("console_list", ""))]
    assert all(r.status_code == 200 for r in warm), [r.text[:200] for r in warm]
    done = 0
    while done < rounds:
        for kind in KINDS:
            client = console if kind.startswith("console") else api
            cpu = server_cpu(group), database_cpu(database)
            for i in range(done, min(rounds, done + block)):
                path = paths(kind, picked[i * len(KINDS) + KINDS.index(kind)])
                started = time.perf_counter()
                answer = client.get(path)
                elapsed = time.perf_counter() - started
                assert answer.status_code == 200, (path, answer.status_code, answer.text[:300])
                if kind == "console_workload":
                    assert "Pod sets" in answer.text
                record = seen[kind]
                record["s"].append(elapsed)
                record["body"].append(answer.num_bytes_downloaded)
                record["headers"].append(
                    sum(len(k) + len(v) + 4 for k, v in answer.headers.raw) + 17
                )
            spent = server_cpu(group) - cpu[0], database_cpu(database) - cpu[1]
            record["cpu"].append(spent[0])
            record["db"].append(spent[1])
        done += block
        log(f"{done}/{rounds} rounds")
    return {kind: summary(values) for kind, values in seen.items()}


def summary(values: dict[str, list[float]]) -> dict[str, Any]:
    times = sorted(values["s"])
    n = len(times)
    return {
        "requests": n,
        "p50_ms": round(1000 * times[n // 2], 2),
        "p99_ms": round(1000 * times[min(n - 1, int(n * 0.99))], 2),
        "mean_ms": round(1000 * statistics.fmean(times), 2),
        "body_bytes": round(statistics.fmean(values["body"])),
        "header_bytes": round(statistics.fmean(values["headers"])),
        "server_cpu_us": round(1e6 * sum(values["cpu"]) / n),
        "database_cpu_us": round(1e6 * sum(values["db"]) / n),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--block", type=int, default=25)
    parser.add_argument("--server", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from sqlalchemy.engine import make_url

    from service.app.migrate import upgrade
    from tests.harness import scratch_database

    with scratch_database(args.server, "bench_console") as url:
        upgrade(url)
        env = {
            "QM_DATABASE_URL": url,
            "QM_BOOTSTRAP_TOKEN": TOKEN,
            "QM_RATE_LIMIT_PER_SECOND": "1000000",
            "QM_RATE_LIMIT_BURST": "1000000",
            "QM_MAX_BODY_BYTES": str(64 << 20),
        }
        results: dict[str, Any] = {
            "bench": "console",
            "command": " ".join(
                ["flock /tmp/qm-bench.lock .venv/bin/python bench/console.py", *sys.argv[1:]]
            ),
            "workloads": args.workloads,
            "rounds": args.rounds,
            "block": args.block,
            "api_workers": 2,
            "load_average": {"start": [round(x, 2) for x in os.getloadavg()]},
        }
        port = free_port()
        with server(["service.api.main:create", "--factory"], env, port, "/readyz") as (
            base,
            group,
        ):
            prepare(base)
            names = fill(base, args.workloads)
            database = make_url(url).database or ""
            results["kinds"] = measure(base, names, args.rounds, args.block, group, database)
        results["load_average"]["end"] = [round(x, 2) for x in os.getloadavg()]
        kinds = results["kinds"]
        results["console_over_api"] = {
            "list_p50": round(kinds["console_list"]["p50_ms"] / kinds["api_list"]["p50_ms"], 2),
            "workload_p50": round(
                kinds["console_workload"]["p50_ms"] / kinds["api_workload"]["p50_ms"], 2
            ),
        }
    line = json.dumps(results)
    if args.out:
        args.out.write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
