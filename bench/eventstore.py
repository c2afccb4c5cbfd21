"""Event store throughput against raw INSERTs, measured in the same run.

    .venv/bin/python bench/eventstore.py [--seconds 3] [--database-url URL]

For 1, 8 and 32 concurrent writers, each appending single-event
transactions, and for batches of 100 events, it reports appends per second
through the event store (idempotency check, optimistic concurrency, gap-free
positions) beside a baseline: plain psycopg INSERTs of the same rows into a
table of the same shape, one transaction each, with no event-store logic.
Batches also report the floor of the COPY path: the same COPY rows into a
copy of ``events`` with all its indexes, without lock, version check or
idempotency (what Postgres itself takes for the rows).
Progress goes to stderr; one JSON line of results to stdout.

Without --database-url it uses the local server at 127.0.0.1:5432 (or an
embedded one) and a scratch database that it drops afterwards.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.app.bootstrap import make_engine
from service.app.migrate import upgrade
from service.eventstore import EventMetadata, NewEvent
from service.eventstore.postgres import PostgresEventStore, _copy_tails
from tests.harness import postgres_server, reset_database, scratch_database

META = EventMetadata(actor="bench", occurred_at=datetime(2026, 11, 29, tzinfo=UTC))
DATA = {"kind": "Workload", "gpus": 8, "queue": "team-a", "note": "x" * 64}


def event() -> NewEvent:
    return NewEvent(uuid.uuid4(), "WorkloadSubmitted", DATA, META)


def hammer(writers: int, seconds: float, case: tuple[str, str, int]) -> float:
    """Run ``writers`` processes, each looping one kind of write for
    ``seconds`` after a common start; return events per second.

    Processes, not threads: API workers are processes, and threads would
    measure the GIL handing the sequencer lock's holder its turn late."""
    ctx = mp.get_context("spawn")
    ready, start = ctx.Barrier(writers + 1), ctx.Event()
    counts = ctx.Array("q", writers)
    procs = [
        ctx.Process(target=_writer, args=(case, w, seconds, ready, start, counts))
        for w in range(writers)
    ]
    for proc in procs:
        proc.start()
    ready.wait()
    started = time.perf_counter()
    start.set()
    for proc in procs:
        proc.join()
    return sum(counts) / (time.perf_counter() - started)


def _writer(
    case: tuple[str, str, int], w: int, seconds: float, ready: Any, start: Any, counts: Any
) -> None:
    kind, url, batch = case
    steps = {"eventstore": eventstore_step, "raw": raw_step, "copy": copy_step}
    step, close = steps[kind](url, batch)
    step(w, -1)  # warm the connection up before the clock starts
    ready.wait()
    start.wait()
    deadline, i, written = time.perf_counter() + seconds, 0, 0
    while time.perf_counter() < deadline:
        written += step(w, i)
        i += 1
    counts[w] = written
    close()


Step = Callable[[int, int], int]


def eventstore_step(url: str, batch: int) -> tuple[Step, Callable[[], None]]:
    engine = make_engine(url, pool_size=1)
    store, run = PostgresEventStore(engine), uuid.uuid4().hex[:8]

    def step(w: int, i: int) -> int:
        store.append(f"bench{run}-{w}-{i}", 0, [event() for _ in range(batch)])
        return batch

    return step, engine.dispose


def raw_step(url: str, batch: int) -> tuple[Step, Callable[[], None]]:
    """Plain INSERTs through psycopg; position from a BIGSERIAL."""
    conn = psycopg.connect(libpq(url))
    sql = (
        "INSERT INTO bench_raw (stream, version, event_id, type, data, metadata) "
        "VALUES (%s, %s, %s, %s, %s, %s)"
    )
    run = uuid.uuid4().hex[:8]

    def step(w: int, i: int) -> int:
        rows = [
            (
                f"raw{run}-{w}-{i}",
                k + 1,
                uuid.uuid4(),
                "WorkloadSubmitted",
                Jsonb(DATA),
                Jsonb(META.to_json()),
            )
            for k in range(batch)
        ]
        with conn.cursor() as cur:
            cur.executemany(sql, rows)
        conn.commit()
        return batch

    return step, conn.close


def copy_step(url: str, batch: int) -> tuple[Step, Callable[[], None]]:
    """The floor of a batch: the event store's own COPY rows (same encoder)
    into a copy of ``events`` with all its indexes, but no sequencer lock,
    version check or idempotency; positions from per-writer counters."""
    conn = psycopg.connect(libpq(url))
    run = uuid.uuid4().hex[:8]
    sql = "COPY bench_copy (position, stream, version, event_id, type, data, metadata) FROM STDIN"

    def step(w: int, i: int) -> int:
        tails = _copy_tails([event() for _ in range(batch)], {})
        # Apart per writer process (pid) and step: no two cases' rows collide.
        base = (os.getpid() % 10**6) * 10**10 + (i + 1) * batch
        stream = f"copy{run}-{w}-{i}"
        lines = [f"{base + k}\t{stream}\t{k + 1}{tail}" for k, tail in enumerate(tails)]
        with conn.cursor().copy(sql) as copy:
            copy.write("".join(lines))
        conn.commit()
        return batch

    return step, conn.close


def create_raw_table(libpq_url: str) -> None:
    with psycopg.connect(libpq_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw")
        conn.execute(
            "CREATE TABLE bench_raw (position bigserial PRIMARY KEY, stream text NOT NULL, "
            "version int NOT NULL, event_id uuid NOT NULL, type text NOT NULL, "
            "data jsonb NOT NULL, metadata jsonb NOT NULL, "
            "recorded_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute("DROP TABLE IF EXISTS bench_copy")
        conn.execute("CREATE TABLE bench_copy (LIKE events INCLUDING ALL)")


@contextmanager
def bench_database(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with (
        ExitStack() as stack,
        postgres_server(stack) as server,
        scratch_database(server, purpose="bench") as scratch,
    ):
        yield scratch


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--database-url")
    parser.add_argument(
        "--cases",
        default="1x1,8x1,32x1,1x100,2x100,8x100",
        help="writers x events per transaction, comma-separated",
    )
    args = parser.parse_args()
    results: dict[str, Any] = {
        "bench": "eventstore",
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds_per_case": args.seconds,
        "load_average": {"before": list(os.getloadavg())},
    }
    with bench_database(args.database_url) as url:
        upgrade(url)
        engine = make_engine(url, pool_size=40)
        reset_database(engine)
        create_raw_table(libpq(url))
        cases = [tuple(int(n) for n in case.split("x")) for case in args.cases.split(",")]
        for writers, batch in cases:
            name = f"{'single' if batch == 1 else f'batch{batch}'}_w{writers}"
            baseline = hammer(writers, args.seconds, ("raw", url, batch))
            ours = hammer(writers, args.seconds, ("eventstore", url, batch))
            results[name] = {
                "eventstore_events_per_s": round(ours),
                "raw_insert_events_per_s": round(baseline),
                "ratio": round(ours / baseline, 3),
            }
            floor = ""
            if batch > 1:
                copied = hammer(writers, args.seconds, ("copy", url, batch))
                results[name]["copy_floor_events_per_s"] = round(copied)
                floor = f"   bare COPY {copied:9.0f}/s"
            print(
                f"{name:>14}: event store {ours:9.0f}/s   raw {baseline:9.0f}/s   "
                f"ratio {ours / baseline:.2f}{floor}",
                file=sys.stderr,
                flush=True,
            )
        with engine.connect() as conn:
            head = conn.exec_driver_sql("SELECT position FROM event_head").scalar_one()
            count = conn.exec_driver_sql("SELECT count(*) FROM events").scalar_one()
        results["gap_free"] = head == count
        engine.dispose()
    results["load_average"]["after"] = list(os.getloadavg())
    print(json.dumps(results))


if __name__ == "__main__":
    main()
