"""A good tenant's submissions beside a hostile one's (issue 18, finding 3).

    .venv/bin/python bench/hostile.py [--submissions 400] [--clients 16]

Serves the API in this process (uvicorn, one worker, as tests/api do) over a
scratch database. The good tenant posts ``--submissions`` valid workloads to
its namespace from ``--clients`` threads, twice: alone, then while an
attacker in another namespace posts as fast as it can bodies that used to
fail whole group-commit batches (a pod template nested 300 levels, memory
"1e30", an integer of 10^30). Prints one JSON line: per phase, the good
tenant's statuses and p50/p99 latency, and the attacker's statuses.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.api.conftest import serve, setup_quota, workload  # noqa: E402


def _hostile(index: int) -> bytes:
    body = workload(f"evil-{index}")
    template = body["spec"]["podSets"][0]["template"]
    kind = index % 3
    if kind == 0:
        nested: Any = "x"
        for _ in range(300):
            nested = {"n": nested}
        template["spec"]["affinity"] = nested
    else:
        requests = template["spec"]["containers"][0]["resources"]["requests"]
        requests["memory"] = "1e30" if kind == 1 else 10**30
    return json.dumps(body).encode()


def _good_phase(client: httpx.Client, prefix: str, count: int, clients: int) -> dict[str, Any]:
    def submit(index: int) -> tuple[int, float]:
        start = time.perf_counter()
        try:
            status = client.post(
                "/v1/namespaces/good/workloads", json=workload(f"{prefix}-{index}")
            ).status_code
        except httpx.HTTPError:
            status = -1  # the connection failed
        return status, time.perf_counter() - start

    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(submit, range(count)))
    latencies = sorted(seconds for _, seconds in results)
    statuses = Counter(status for status, _ in results)
    return {
        "submissions": count,
        "created": statuses.get(201, 0),
        "success_rate": round(statuses.get(201, 0) / count, 4),
        "statuses": dict(statuses),
        "p50_ms": round(statistics.median(latencies) * 1e3, 1),
        "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1e3, 1),
    }


def _attack(client: httpx.Client, stop: threading.Event, statuses: Counter[int]) -> None:
    index = 0
    headers = {"content-type": "application/json"}
    while not stop.is_set():
        try:
            response = client.post(
                "/v1/namespaces/evil/workloads", content=_hostile(index), headers=headers
            )
            statuses[response.status_code] += 1
        except httpx.HTTPError:
            statuses[-1] += 1
        index += 1


def _tenant(admin: httpx.Client, namespace: str, connections: int) -> httpx.Client:
    """A client with a submitter token for ``namespace`` alone."""
    issued = admin.post(
        "/v1/tokens", json={"name": namespace, "role": "submitter", "namespaces": [namespace]}
    )
    issued.raise_for_status()
    return httpx.Client(
        base_url=str(admin.base_url),
        headers={"Authorization": f"Bearer {issued.json()['token']}"},
        timeout=60,
        limits=httpx.Limits(max_connections=connections),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--submissions", type=int, default=400)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--attackers", type=int, default=8)
    parser.add_argument("--server", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    from service.app.migrate import upgrade
    from tests.harness import scratch_database

    with scratch_database(args.server, "bench_hostile") as url:
        upgrade(url)
        with serve(url) as (base_url, _):
            admin = httpx.Client(
                base_url=base_url,
                headers={"Authorization": "Bearer test-bootstrap-admin-token"},
                timeout=60,
            )
            setup_quota(admin, namespace="good")
            setup_quota(admin, namespace="evil", cq="cq-evil")
            good = _tenant(admin, "good", args.clients)
            evil = _tenant(admin, "evil", args.attackers)
            alone = _good_phase(good, "alone", args.submissions, args.clients)
            print("alone:", alone, file=sys.stderr)
            stop, attacked = threading.Event(), Counter[int]()
            attackers = [
                threading.Thread(target=_attack, args=(evil, stop, attacked))
                for _ in range(args.attackers)
            ]
            for thread in attackers:
                thread.start()
            beside = _good_phase(good, "beside", args.submissions, args.clients)
            stop.set()
            for thread in attackers:
                thread.join()
            print("beside the attacker:", beside, file=sys.stderr)
    result = {
        "bench": "hostile",
        "command": " ".join(["bench/hostile.py", *sys.argv[1:]]),
        "clients": args.clients,
        "attackers": args.attackers,
        "alone": alone,
        "beside_attacker": beside,
        "attacker_statuses": dict(attacked),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
