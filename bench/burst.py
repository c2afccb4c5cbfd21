"""One tenant bursting to 10x its rate beside others (issue 18, finding 9).

    flock /tmp/qm-bench.lock .venv/bin/python bench/burst.py [--rounds 8]
        [--seconds 30] [--tenants 3] [--rate 20] [--limit 25] [--out FILE]

The API as in production: uvicorn with two worker processes, as
``quartermaster api --workers 2`` runs it (its HTTP protocol, a shared
metrics directory, the access log on, to a file here), rate limits shared
in Redis (a db of its own), production's pool and thread sizes, over a
scratch database. Each process's app adds a Server-Timing header (bench/
burst_load.py), so the API's share of a request's time is told apart from
the box's.

Load from two processes of their own (bench/burst_load.py, cheap asyncio
clients that measure their own CPU): ``--tenants`` good tenants at
``--rate`` requests/s each all along (half lists of their workloads, half
submissions), and a noisy tenant doing the same at ``--rate`` in quiet
phases and ten times it in burst phases, with a per-principal limit of
``--limit``/s (burst as large). Phases interleave: an unmeasured warm-up,
then quiet, burst, quiet, ... (``--rounds`` bursts, each between two quiet
phases, of ``--seconds`` each). Per round, the good tenants' p99 in the
burst over their p99 in the two quiet phases beside it (target <= 1.2),
client-side and in the API; the same for consecutive quiet phases (how much
p99 moves with no burst at all); CPU per phase of the API processes, the
generators, our database's Postgres backends, Redis and the whole box; the
load average at each phase's end. Writes one JSON document (``--out``, or
stdout).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

NOISY = "noisy"
WARM_SECONDS = 10.0


# -- the API, as production serves it ------------------------------------------------------


def serve(port: int) -> None:
    """``quartermaster api --workers 2``, serving ``burst_load:timed_app``."""
    import uvicorn

    from service.api.server import HTTP_PROTOCOL

    uvicorn.run(
        "burst_load:timed_app",
        factory=True,
        app_dir=str(HERE),
        host="127.0.0.1",
        port=port,
        workers=2,
        http=HTTP_PROTOCOL,
    )


def _start_api(stack: ExitStack, scratch: Path, env: dict[str, str]) -> tuple[Any, str]:
    import httpx

    from service.runtime.embedded import free_port

    port = free_port()
    metrics = scratch / "metrics"
    metrics.mkdir()
    log = (scratch / "api.log").open("wb")
    stack.callback(log.close)
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port)],
        env={**os.environ, **env, "PROMETHEUS_MULTIPROC_DIR": str(metrics)},
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    stack.callback(_stop, process)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                return process, base
        except httpx.HTTPError:
            pass  # not listening yet
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(
                f"the API did not start: {(scratch / 'api.log').read_text()[-2000:]}"
            )
        time.sleep(0.2)


def _stop(process: Any) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _tenants(base: str, admin_token: str, names: list[str]) -> dict[str, str]:
    """A queue with quota and a submitter token for each tenant."""
    import httpx

    from tests.api.conftest import setup_quota

    tokens: dict[str, str] = {}
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {admin_token}"}, timeout=60
    ) as admin:
        for index, tenant in enumerate(names):
            setup_quota(admin, namespace=tenant, cq=f"cq-{index}")
            issued = admin.post(
                "/v1/tokens", json={"name": tenant, "role": "submitter", "namespaces": [tenant]}
            )
            issued.raise_for_status()
            tokens[tenant] = issued.json()["token"]
    return tokens


# -- what each phase cost, and where -------------------------------------------------------


def _box_busy() -> float:
    """CPU seconds the whole box has been busy, every core."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / ticks


def _cpu_of(processes: list[Any]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except Exception:  # gone since listed: its CPU is no longer counted anywhere
            continue
    return total


class Sampler:
    """CPU seconds so far of the API's processes (each), our database's
    Postgres backends, Redis, and the box; the load average."""

    def __init__(self, api: Any, database: str, redis_port: str) -> None:
        import psutil

        self.psutil = psutil
        self.api = psutil.Process(api.pid)
        self.database = database
        self.redis = f":{redis_port}"

    def sample(self) -> dict[str, Any]:
        workers = self.api.children(recursive=True)
        backends, redis = [], []
        for process in self.psutil.process_iter(["name", "cmdline"]):
            name = process.info["name"] or ""
            cmdline = " ".join(process.info["cmdline"] or []).strip()
            if name.startswith("postgres") and self.database in cmdline:
                backends.append(process)
            elif name.startswith("redis-server") and cmdline.endswith(self.redis):
                redis.append(process)
        return {
            "api": {str(w.pid): _cpu_of([w]) for w in workers},
            "api_parent": _cpu_of([self.api]),
            "postgres": {str(p.pid): _cpu_of([p]) for p in backends},
            "redis": _cpu_of(redis),
            "box": _box_busy(),
            "load_average": [round(v, 2) for v in os.getloadavg()],
        }


def _spent(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    def delta(key: str) -> float:
        return float(sum(after[key][k] - v for k, v in before[key].items() if k in after[key]))

    new_backends = sum(v for k, v in after["postgres"].items() if k not in before["postgres"])
    return {
        "api_s": round(delta("api") + after["api_parent"] - before["api_parent"], 2),
        "api_per_process_s": {
            k: round(after["api"][k] - v, 2) for k, v in before["api"].items() if k in after["api"]
        },
        "postgres_backends_s": round(delta("postgres") + new_backends, 2),
        "redis_s": round(after["redis"] - before["redis"], 2),
        "box_busy_s": round(after["box"] - before["box"], 2),
        "load_average_at_end": after["load_average"],
    }


# -- figures -------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of all at or below it."""
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])


def _ok(record: list[Any]) -> bool:
    return bool(200 <= record[2] < 300)


def _client(records: list[list[Any]]) -> list[float]:
    """Each request's ms from write to answer; a failure (no answer, 4xx,
    5xx) as never answered."""
    return [r[3] if _ok(r) else math.inf for r in records]


def _server(records: list[list[Any]]) -> list[float]:
    """Each request's ms in the API; a failure as never answered."""
    return [r[4] if _ok(r) and r[4] >= 0 else math.inf for r in records]


def _ms(value: float) -> float | None:
    return None if math.isinf(value) else round(value, 1)


def _ratio(over: float, under: float) -> float:
    """``over / under``; a failed ``under`` leaves it undefined (nan), a
    failed ``over`` alone makes it infinite."""
    if math.isinf(under):
        return math.nan
    return math.inf if math.isinf(over) else round(over / under, 3)


def _good_summary(records: list[list[Any]]) -> dict[str, Any]:
    latency = _client(records)
    by_kind = {
        kind: _client([r for r in records if r[1] == index])
        for index, kind in enumerate(("list", "submit"))
    }
    return {
        "requests": len(records),
        "statuses": dict(sorted(Counter(str(r[2]) for r in records).items())),
        "failed": sum(not _ok(r) for r in records),
        "p50_ms": _ms(_quantile(latency, 0.5)),
        "p99_ms": _ms(_quantile(latency, 0.99)),
        "samples_above_p99": len(latency) - math.ceil(0.99 * len(latency)),
        "server_p50_ms": _ms(_quantile(_server(records), 0.5)),
        "server_p99_ms": _ms(_quantile(_server(records), 0.99)),
        "p99_by_kind_ms": {k: _ms(_quantile(v, 0.99)) for k, v in by_kind.items()},
        "late_p99_ms": round(_quantile([r[6] for r in records], 0.99), 1),
        "by_api_process": dict(Counter(str(r[5]) for r in records if r[2] > 0)),
    }


def _noisy_summary(records: list[list[Any]]) -> dict[str, Any]:
    refused = [r[4] for r in records if r[2] == 429 and r[4] >= 0]
    return {
        "requests": len(records),
        "statuses": dict(sorted(Counter(str(r[2]) for r in records).items())),
        "answered_2xx": sum(200 <= r[2] < 300 for r in records),
        "refused_429": sum(r[2] == 429 for r in records),
        "server_p50_ms_of_429": round(_quantile(refused, 0.5), 3) if refused else None,
        "by_api_process": dict(Counter(str(r[5]) for r in records if r[2] > 0)),
    }


def _spread(values: list[float]) -> dict[str, float | None]:
    """Median, quartiles and range; a round whose p99 failed counts as
    larger than any (null in JSON)."""
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return {"median": None, "min": None, "max": None, "q1": None, "q3": None}
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else ordered * 3
    return {
        "median": _ms3(statistics.median(ordered)),
        "min": _ms3(ordered[0]),
        "max": _ms3(ordered[-1]),
        "q1": _ms3(quartiles[0]),
        "q3": _ms3(quartiles[2]),
    }


def _ms3(value: float) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else round(value, 3)


def _rounds(phases: list[dict[str, Any]], good: list[list[list[Any]]]) -> list[dict[str, Any]]:
    """Per burst: its good tenants' p99 over that of the quiet phases beside it."""
    rounds: list[dict[str, Any]] = []
    for index, phase in enumerate(phases):
        if phase["kind"] != "burst":
            continue
        quiet, hot = good[index - 1] + good[index + 1], good[index]
        quiet_p99 = _quantile(_client(quiet), 0.99)
        burst_p99 = _quantile(_client(hot), 0.99)
        quiet_server = _quantile(_server(quiet), 0.99)
        burst_server = _quantile(_server(hot), 0.99)
        before = _quantile(_client(good[index - 1]), 0.99)
        after = _quantile(_client(good[index + 1]), 0.99)
        rounds.append(
            {
                "round": len(rounds) + 1,
                "quiet_p50_ms": _ms(_quantile(_client(quiet), 0.5)),
                "burst_p50_ms": _ms(_quantile(_client(hot), 0.5)),
                "quiet_p99_ms": _ms(quiet_p99),
                "burst_p99_ms": _ms(burst_p99),
                "p99_ratio": _ratio(burst_p99, quiet_p99),
                "quiet_server_p99_ms": _ms(quiet_server),
                "burst_server_p99_ms": _ms(burst_server),
                "server_p99_ratio": _ratio(burst_server, quiet_server),
                "quiet_after_over_before_p99": _ratio(after, before),
                "good_failed": {
                    "quiet": sum(not _ok(r) for r in quiet),
                    "burst": sum(not _ok(r) for r in hot),
                },
            }
        )
    return rounds


# -- the run -------------------------------------------------------------------------------


def _schedule(rounds: int, seconds: float) -> list[dict[str, Any]]:
    phases = [{"kind": "warm-up", "seconds": WARM_SECONDS}]
    for _ in range(rounds):
        phases += [{"kind": "quiet", "seconds": seconds}, {"kind": "burst", "seconds": seconds}]
    return [*phases, {"kind": "quiet", "seconds": seconds}]


def _generator(
    scratch: Path, name: str, spec: dict[str, Any], stack: ExitStack
) -> tuple[Any, Path]:
    spec_path, out_path = scratch / f"{name}.spec.json", scratch / f"{name}.out.json"
    spec_path.write_text(json.dumps(spec))
    process = subprocess.Popen(
        [sys.executable, str(HERE / "burst_load.py"), str(spec_path), str(out_path)], cwd=ROOT
    )
    stack.callback(_stop, process)
    return process, out_path


def run(args: argparse.Namespace) -> dict[str, Any]:
    from service.app.migrate import upgrade
    from tests.api.conftest import ADMIN_TOKEN
    from tests.harness import redis_database, redis_server, scratch_database

    phases = _schedule(args.rounds, args.seconds)
    good_names = [f"good-{chr(ord('a') + i)}" for i in range(args.tenants)]
    with ExitStack() as stack:
        scratch = Path(tempfile.mkdtemp(prefix="qm-bench-burst-"))
        stack.callback(shutil.rmtree, scratch, ignore_errors=True)
        url = stack.enter_context(scratch_database(args.server, "bench_burst"))
        upgrade(url)
        redis_url = stack.enter_context(redis_database(stack.enter_context(redis_server(stack))))
        env = {
            "QM_DATABASE_URL": url,
            "QM_BOOTSTRAP_TOKEN": ADMIN_TOKEN,
            "QM_RATE_LIMIT_PER_SECOND": str(args.limit),
            "QM_RATE_LIMIT_BURST": str(int(args.limit)),
            "QM_RATE_LIMIT_REDIS_URL": redis_url,
        }
        api, base = _start_api(stack, scratch, env)
        try:
            tokens = _tenants(base, ADMIN_TOKEN, [*good_names, NOISY])
            sampler = Sampler(api, url.rsplit("/", 1)[1], redis_url.rsplit(":", 1)[1].split("/")[0])
            samples, runs = _drive(args, phases, scratch, base, tokens, sampler, stack)
        except BaseException:
            print((scratch / "api.log").read_text()[-4000:], file=sys.stderr)
            raise
        api_log = _log_lines(scratch / "api.log")
    return _report(args, phases, samples, runs[0], runs[1], api_log)


def _log_lines(path: Path) -> dict[str, int]:
    """What the API processes logged: access lines, warnings, tracebacks."""
    counts: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        counts["lines"] += 1
        counts["access"] += '" 2' in line or '" 4' in line or '" 5' in line
        counts["redis_unreachable"] += "Redis unreachable" in line
        counts["warning_or_error"] += line.startswith(("WARNING", "ERROR")) or " WARNING " in line
        counts["traceback"] += line.startswith("Traceback")
    return dict(counts)


def _drive(
    args: argparse.Namespace,
    phases: list[dict[str, Any]],
    scratch: Path,
    base: str,
    tokens: dict[str, str],
    sampler: Sampler,
    stack: ExitStack,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Both generators through every phase; a sample at each phase's end."""
    from tests.api.conftest import workload

    start = time.monotonic() + 5.0

    def spec(names: list[str], rates: list[float]) -> dict[str, Any]:
        return {
            "port": int(base.rsplit(":", 1)[1]),
            "start": start,
            "tag": "w",
            "phases": [p["seconds"] for p in phases],
            "tenants": [
                {
                    "namespace": n,
                    "token": tokens[n],
                    "rates": rates,
                    "connections": 4,
                    "workload": workload("NAME"),
                }
                for n in names
            ],
        }

    good = [n for n in tokens if n != NOISY]
    noisy_rates = [10 * args.rate if p["kind"] == "burst" else args.rate for p in phases]
    generators = [
        _generator(scratch, "good", spec(good, [args.rate] * len(phases)), stack),
        _generator(scratch, NOISY, spec([NOISY], noisy_rates), stack),
    ]
    time.sleep(max(0.0, start - time.monotonic()))
    samples = [sampler.sample()]
    at = start
    for phase in phases:
        at += phase["seconds"]
        time.sleep(max(0.0, at - time.monotonic()))
        samples.append(sampler.sample())
        spent = _spent(samples[-2], samples[-1])
        print(phase["kind"], spent["api_s"], spent["load_average_at_end"], file=sys.stderr)
    for process, _ in generators:
        if process.wait(120) != 0:
            raise RuntimeError("a load generator failed")
    return samples, [json.loads(out.read_text()) for _, out in generators]


def _report(
    args: argparse.Namespace,
    phases: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    good_run: dict[str, Any],
    noisy_run: dict[str, Any],
    api_log: dict[str, int],
) -> dict[str, Any]:
    good: list[list[list[Any]]] = [[] for _ in phases]
    for tenant in good_run["tenants"]:
        for record in tenant["records"]:
            good[record[0]].append(record)
    noisy: list[list[list[Any]]] = [[] for _ in phases]
    for record in noisy_run["tenants"][0]["records"]:
        noisy[record[0]].append(record)
    figures = []
    for index, phase in enumerate(phases):
        figures.append(
            {
                **phase,
                "noisy_rate": 10 * args.rate if phase["kind"] == "burst" else args.rate,
                "good": _good_summary(good[index]),
                "noisy": _noisy_summary(noisy[index]),
                "cpu": {
                    **_spent(samples[index], samples[index + 1]),
                    "good_generator_s": good_run["cpu_seconds"][index],
                    "noisy_generator_s": noisy_run["cpu_seconds"][index],
                },
            }
        )
    measured = figures[1:]
    rounds = _rounds(phases[1:], good[1:])
    quiet = [r for i, f in enumerate(measured) if f["kind"] == "quiet" for r in good[i + 1]]
    burst = [r for i, f in enumerate(measured) if f["kind"] == "burst" for r in good[i + 1]]
    pooled = {
        kind: {
            "p99_ms": _ms(_quantile(_client(rs), 0.99)),
            "server_p99_ms": _ms(_quantile(_server(rs), 0.99)),
            "requests": len(rs),
        }
        for kind, rs in (("quiet", quiet), ("burst", burst))
    }
    ratios = [r["p99_ratio"] for r in rounds]
    pooled_ratio = _ratio(_quantile(_client(burst), 0.99), _quantile(_client(quiet), 0.99))
    return {
        "bench": "burst",
        "command": "flock /tmp/qm-bench.lock .venv/bin/python "
        + " ".join(["bench/burst.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "settings": {
            "api_processes": 2,
            "good_tenants": args.tenants,
            "tenant_rate": args.rate,
            "noisy_burst_rate": 10 * args.rate,
            "limit_per_principal": args.limit,
            "seconds_per_phase": args.seconds,
            "rounds": args.rounds,
            "cores": os.cpu_count(),
        },
        "summary": {
            "p99_ratio": _spread(ratios),
            "server_p99_ratio": _spread([r["server_p99_ratio"] for r in rounds]),
            "quiet_after_over_before_p99": _spread(
                [r["quiet_after_over_before_p99"] for r in rounds]
            ),
            "pooled": {**pooled, "p99_ratio": _ms3(pooled_ratio)},
            "rounds_undefined": sum(math.isnan(r) for r in ratios),
            "target_met": bool(
                [r for r in ratios if not math.isnan(r)]
                and statistics.median(r for r in ratios if not math.isnan(r)) <= 1.2
            ),
            "api_cpu_share": {
                kind: round(
                    statistics.mean(
                        f["cpu"]["api_s"] / f["seconds"] for f in measured if f["kind"] == kind
                    ),
                    3,
                )
                for kind in ("quiet", "burst")
            },
            "noisy_2xx_per_s": {
                kind: round(
                    statistics.mean(
                        f["noisy"]["answered_2xx"] / f["seconds"]
                        for f in measured
                        if f["kind"] == kind
                    ),
                    1,
                )
                for kind in ("quiet", "burst")
            },
            "good_unanswered": good_run["unanswered"],
            "api_log": api_log,
        },
        "rounds": [
            {
                k: _ms3(v) if k.endswith("ratio") or k.endswith("before_p99") else v
                for k, v in r.items()
            }
            for r in rounds
        ],
        "phases": figures,
    }


def _commit() -> str | None:
    """The code measured: this checkout's commit, or QM_BENCH_COMMIT for a copy."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() or os.environ.get("QM_BENCH_COMMIT")


def table(result: dict[str, Any]) -> str:
    """The per-round table of bench/results/README.md."""
    phases = result["phases"][1:]
    lines = [
        "| round | good p50 quiet → burst | good p99 quiet → burst | p99 ratio "
        "| in the API: p99 quiet → burst (ratio) | quiet after / before | good failed "
        "| noisy in burst: 2xx / 429 | generator CPU, noisy in burst | API CPU quiet → burst "
        "| load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shown in result["rounds"]:
        r: dict[str, Any] = {k: "—" if v is None else v for k, v in shown.items()}
        at = 2 * shown["round"]
        before, burst, after = phases[at - 2 : at + 1]
        quiet_api = (before["cpu"]["api_s"] + after["cpu"]["api_s"]) / 2
        seconds = burst["seconds"]
        lines.append(
            f"| {r['round']} | {r['quiet_p50_ms']} → {r['burst_p50_ms']} ms "
            f"| {r['quiet_p99_ms']} → {r['burst_p99_ms']} ms | x{r['p99_ratio']} "
            f"| {r['quiet_server_p99_ms']} → {r['burst_server_p99_ms']} ms "
            f"(x{r['server_p99_ratio']}) | x{r['quiet_after_over_before_p99']} "
            f"| {r['good_failed']['quiet']} / {r['good_failed']['burst']} "
            f"| {burst['noisy']['answered_2xx']:,} / {burst['noisy']['refused_429']:,} "
            f"| {100 * burst['cpu']['noisy_generator_s'] / seconds:.1f} % of a core "
            f"| {100 * quiet_api / seconds:.0f} → {100 * burst['cpu']['api_s'] / seconds:.0f} % "
            f"| {burst['cpu']['load_average_at_end'][0]} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30, help="per phase")
    parser.add_argument("--tenants", type=int, default=3, help="good tenants")
    parser.add_argument("--rate", type=float, default=20, help="each tenant's requests/s")
    parser.add_argument("--limit", type=float, default=25, help="per-principal limit, requests/s")
    parser.add_argument("--server", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--table", type=Path, default=None, help="print a result's table")
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    if args.table is not None:
        print(table(json.loads(args.table.read_text())))
        return
    result = run(args)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps(result["summary"]), file=sys.stderr)
    print(table(result), file=sys.stderr)
    if not args.out:
        print(text)


if __name__ == "__main__":
    main()
