"""One tenant bursting to 10x its rate beside others (issue 18, finding 9).

    .venv/bin/python bench/burst.py [--seconds 20] [--rate 20] [--limit 40]

The API serves in a child process (uvicorn, one worker, as tests/api do)
over a scratch database, with a per-principal limit of ``--limit``
requests/s (burst as large). Three good tenants each send ``--rate``
requests/s, paced, from two threads (half lists of their workloads, half
submissions); a fourth, noisy tenant the same from another process. Twice:
the noisy tenant at its rate (the baseline), then at ten times it, then at
its rate again. Prints
one JSON line: per phase, the good tenants' statuses and p50/p99, the noisy
tenant's statuses, and the ratio of the good tenants' p99s (target <= 1.2).
An unmeasured warm-up comes first, and the baseline again after the burst,
to show how much the figures move without it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.api.conftest import ADMIN_TOKEN, serve, setup_quota, workload  # noqa: E402

TENANTS = ("good-a", "good-b", "good-c")


def _server(url: str, limit: float, ready: Any, stop: Any) -> None:
    with serve(url, rate_limit_per_second=limit, rate_limit_burst=int(limit)) as (base, _):
        ready.put(base)
        stop.wait()


def _paced(
    client: httpx.Client, namespace: str, rate: float, until: float, seen: list[Any], tag: str
) -> None:
    """Requests at ``rate`` per second until ``until``: (status, seconds)."""
    index, next_at = 0, time.monotonic()
    while (now := time.monotonic()) < until:
        if now < next_at:
            time.sleep(next_at - now)
        next_at += 1 / rate
        start = time.perf_counter()
        try:
            if index % 2:
                name = f"{tag}-{threading.get_ident()}-{index}"
                path = f"/v1/namespaces/{namespace}/workloads"
                status = client.post(path, json=workload(name)).status_code
            else:
                status = client.get(f"/v1/namespaces/{namespace}/workloads?limit=20").status_code
        except httpx.HTTPError:
            status = -1
        seen.append((status, time.perf_counter() - start))
        index += 1


def _load(
    base: str, token: str, namespace: str, rate: float, threads: int, seconds: float, tag: str
) -> list[Any]:
    until = time.monotonic() + seconds
    seen: list[Any] = []
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as client:
        workers = [
            threading.Thread(
                target=_paced, args=(client, namespace, rate / threads, until, seen, tag)
            )
            for _ in range(threads)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    return seen


def _noisy(base: str, token: str, rate: float, seconds: float, tag: str, out: Any) -> None:
    threads = max(2, int(rate // 10))
    seen = _load(base, token, "noisy", rate, threads, seconds, tag)
    out.put(dict(Counter(status for status, _ in seen)))


def _summary(seen: list[Any]) -> dict[str, Any]:
    latencies = sorted(seconds for status, seconds in seen if status > 0)
    return {
        "requests": len(seen),
        "statuses": dict(Counter(status for status, _ in seen)),
        "p50_ms": round(statistics.median(latencies) * 1e3, 1),
        "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1e3, 1),
    }


def _phase(
    base: str, tokens: dict[str, str], rate: float, noisy_rate: float, seconds: float, tag: str
) -> dict[str, Any]:
    out: Any = mp.Queue()
    noisy = mp.Process(target=_noisy, args=(base, tokens["noisy"], noisy_rate, seconds, tag, out))
    noisy.start()
    results: dict[str, list[Any]] = {}
    good = [
        threading.Thread(
            target=lambda t=t: results.__setitem__(
                t, _load(base, tokens[t], t, rate, 2, seconds, tag)
            )
        )
        for t in TENANTS
    ]
    for thread in good:
        thread.start()
    for thread in good:
        thread.join()
    noisy_statuses = out.get(timeout=120)
    noisy.join(60)
    return {
        "noisy_rate": noisy_rate,
        "good": _summary([s for t in TENANTS for s in results[t]]),
        "noisy_statuses": noisy_statuses,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rate", type=float, default=20, help="each tenant's requests/s")
    parser.add_argument("--limit", type=float, default=40, help="per-principal limit, requests/s")
    parser.add_argument("--server", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    from service.app.migrate import upgrade
    from tests.harness import scratch_database

    with scratch_database(args.server, "bench_burst") as url:
        upgrade(url)
        ready, stop = mp.Queue(), mp.Event()
        server = mp.Process(target=_server, args=(url, args.limit, ready, stop))
        server.start()
        base = ready.get(timeout=120)
        try:
            admin = httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
            )
            tokens: dict[str, str] = {}
            for index, tenant in enumerate((*TENANTS, "noisy")):
                setup_quota(admin, namespace=tenant, cq=f"cq-{index}")
                issued = admin.post(
                    "/v1/tokens",
                    json={"name": tenant, "role": "submitter", "namespaces": [tenant]},
                )
                issued.raise_for_status()
                tokens[tenant] = issued.json()["token"]
            # Unmeasured: first connections, caches and the server's warm-up
            # would otherwise all fall in the baseline.
            _phase(base, tokens, args.rate, args.rate, min(5.0, args.seconds), "warm")
            baseline = _phase(base, tokens, args.rate, args.rate, args.seconds, "base")
            print("baseline:", baseline, file=sys.stderr)
            burst = _phase(base, tokens, args.rate, 10 * args.rate, args.seconds, "burst")
            print("burst:", burst, file=sys.stderr)
            after = _phase(base, tokens, args.rate, args.rate, args.seconds, "after")
            print("after:", after, file=sys.stderr)
        finally:
            stop.set()
            server.join(60)
    result = {
        "bench": "burst",
        "command": " ".join(["bench/burst.py", *sys.argv[1:]]),
        "tenant_rate": args.rate,
        "limit_per_principal": args.limit,
        "seconds_per_phase": args.seconds,
        "baseline": baseline,
        "burst": burst,
        "after": after,
        "good_p99_ratio": round(burst["good"]["p99_ms"] / baseline["good"]["p99_ms"], 3),
        "good_p50_ratio": round(burst["good"]["p50_ms"] / baseline["good"]["p50_ms"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
