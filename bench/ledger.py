"""Ledger benchmark: chained appends, verifying and exporting a million entries.

    .venv/bin/python bench/ledger.py [--entries 1000000] [--seconds 3] [--database-url URL]

Measured in one run, each beside its baseline:

* appends per second through the Postgres ledger writer (tip lock, hash
  chain, idempotency check, the bytes hashed stored beside the columns and
  checked against them by migration 0007's constraint), one transaction per
  append, for 1 and 4 writer processes and batches of 1 and 100 — baseline:
  plain INSERTs of the same rows into a table of the same shape (without the
  constraint), one transaction each;
* then ``--entries`` entries are sealed and loaded with COPY (the constraint
  checking every row), and a signed checkpoint made (plus an older one at
  half the size); the query indexes are built afterwards, as a restore would;
* full verification (every hash, the chain, the Merkle root against the
  signed checkpoint, consistency with the older one) of the live ledger —
  its stored bytes streamed by binary COPY and hashed as they are — and of
  its NDJSON export file (target ≤ 10 s); beside it, the floor (the same rows
  received by binary COPY, nothing else) and the way verify --live went
  before migration 0007 (every row read as columns and serialised again);
* export rate and peak memory streaming all entries to NDJSON, and peak
  memory exporting a tenth of them (constant memory: the two peaks match);
* p50/p99 of one page of typical filtered auditor queries (in-process,
  through the reader), against an unfiltered page;
* baseline: a plain server-side-cursor ``SELECT`` of the same rows.

Verification and export run in fresh processes so that their peak RSS and
CPU time (``cpu_seconds``: the client's, not the database server's) are
theirs alone; ``load_1m`` is the load average as each began and ended.
Progress goes to stderr; one JSON line to stdout. Without --database-url it
uses a scratch database on 127.0.0.1:5432 (or an embedded server) and drops
it afterwards; the export file is deleted too.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.app.bootstrap import make_engine
from service.app.migrate import upgrade
from service.ledger.chain import GENESIS_HASH, NewLedgerEntry, seal_with_bytes
from service.ledger.checkpoint import Checkpoint, NoteSigner, sign_checkpoint
from service.ledger.entries import (
    WorkloadAdmitted,
    WorkloadFinished,
    WorkloadSubmitted,
)
from service.ledger.export import ExportRecord
from service.ledger.merkle import CompactRange, leaf_hash
from service.ledger.postgres import PostgresLedgerWriter
from tests.harness import postgres_server, reset_database, scratch_database

T0 = datetime(2026, 11, 1, tzinfo=UTC)
ORIGIN = "bench.quartermaster.dev/ledger"
COLUMNS = "seq, entry_id, kind, recorded_at, body, prev_hash, entry_hash"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


# --- realistic entries: a third each submitted, admitted, finished ---------------------


def _templates() -> list[tuple[str, dict[str, Any]]]:
    queues = {"namespace": "team-a", "workload": "w", "local_queue": "lq", "cluster_queue": "cq"}
    reserved = {"h100": {"nvidia.com/gpu": 64, "cpu": 512_000, "memory": 8 * 2**40 // 8}}
    bodies = [
        WorkloadSubmitted(
            **queues, actor="ci-bot", workload_class="training", priority=100, requests={}
        ),
        WorkloadAdmitted(
            **queues,
            cluster="cluster-eu-1",
            flavors={"nvidia.com/gpu": "h100", "cpu": "h100", "memory": "h100"},
            island="fabric-block-3",
            reserved=reserved,
            borrowed={},
            reason="fits nominal quota of cq; island fabric-block-3 has 8 free nodes",
        ),
        WorkloadFinished(
            **queues,
            cluster="cluster-eu-1",
            outcome="succeeded",
            started_at=T0,
            finished_at=T0,
            consumed={"h100": {"nvidia.com/gpu": 230411.25}},
            gpu_seconds=230411.25,
            cpu_seconds=1843290.5,
            memory_gib_seconds=3686580.75,
        ),
    ]
    return [(b.KIND, b.model_dump(mode="json")) for b in bodies]


TEMPLATES = _templates()


def make_item(i: int) -> NewLedgerEntry:
    kind, template = TEMPLATES[i % 3]
    body = {**template, "workload": f"train-{i // 3}", "namespace": f"team-{i % 17}"}
    if kind == "workload.finished":
        body["gpu_seconds"] = 230411.25 + (i % 1000) / 8
    return NewLedgerEntry(uuid.uuid4(), kind, body, T0 + timedelta(milliseconds=i * 37))


# --- appends ---------------------------------------------------------------------------


def hammer(writers: int, seconds: float, case: tuple[str, str, int]) -> float:
    """``writers`` processes loop one kind of write for ``seconds`` after a
    common start; entries per second. Processes, like API workers."""
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
    return float(sum(int(c) for c in counts[:])) / (time.perf_counter() - started)


def _writer(
    case: tuple[str, str, int], w: int, seconds: float, ready: Any, start: Any, counts: Any
) -> None:
    kind, url, batch = case
    step, close = (ledger_step if kind == "ledger" else raw_step)(url, batch)
    step(w, -1)  # warm up before the clock starts
    ready.wait()
    start.wait()
    deadline, i, written = time.perf_counter() + seconds, 0, 0
    while time.perf_counter() < deadline:
        written += step(w, i)
        i += 1
    counts[w] = written
    close()


Step = Callable[[int, int], int]


def ledger_step(url: str, batch: int) -> tuple[Step, Callable[[], None]]:
    engine = make_engine(url, pool_size=1)

    def step(w: int, i: int) -> int:
        with engine.begin() as conn:
            PostgresLedgerWriter(conn).append([make_item(i * batch + k) for k in range(batch)])
        return batch

    return step, engine.dispose


def raw_step(url: str, batch: int) -> tuple[Step, Callable[[], None]]:
    """The same rows, no chain: hashes are random bytes, seq a BIGSERIAL."""
    conn = psycopg.connect(libpq(url))
    sql = (
        "INSERT INTO bench_raw_ledger (entry_id, kind, recorded_at, body, prev_hash, entry_hash, "
        "entry_bytes) VALUES (%s, %s, %s, %s, %s, %s, %s)"
    )

    def step(w: int, i: int) -> int:
        rows = []
        for k in range(batch):
            item = make_item(i * batch + k)
            rows.append(
                (
                    item.entry_id,
                    item.kind,
                    item.recorded_at,
                    Jsonb(dict(item.body)),
                    os.urandom(32),
                    os.urandom(32),
                    json.dumps(dict(item.body)).encode(),
                )
            )
        with conn.cursor() as cur:
            cur.executemany(sql, rows)
        conn.commit()
        return batch

    return step, conn.close


def create_raw_table(url: str) -> None:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw_ledger")
        conn.execute(
            "CREATE TABLE bench_raw_ledger (seq bigserial PRIMARY KEY, entry_id uuid NOT NULL "
            "UNIQUE, kind text NOT NULL, recorded_at timestamptz NOT NULL, body jsonb NOT NULL, "
            "prev_hash bytea NOT NULL, entry_hash bytea NOT NULL, entry_bytes bytea NOT NULL)"
        )
        # The same indexes as ledger_entries (0001 and 0004), so that only the
        # ledger's own work differs.
        conn.execute("CREATE INDEX ON bench_raw_ledger (kind, recorded_at)")
        conn.execute("CREATE INDEX ON bench_raw_ledger (recorded_at)")
        conn.execute("CREATE INDEX ON bench_raw_ledger USING gin (body jsonb_path_ops)")


# --- a million entries -------------------------------------------------------------------


def fill(url: str, n: int, signer: NoteSigner) -> tuple[str, str, float, float]:
    """Seal ``n`` entries and COPY them in; return the signed checkpoint, one
    at half the size, and the seconds the load and the index builds took.
    Equivalent to appending through the writer, only faster: the same ``seal``."""
    started = time.perf_counter()
    frontier, previous, older = CompactRange(), GENESIS_HASH, ""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        for name in QUERY_INDEXES:
            conn.execute(f"DROP INDEX {name}")
    with psycopg.connect(libpq(url)) as conn:
        copy_sql = f"COPY ledger_entries ({COLUMNS}, entry_bytes) FROM STDIN"
        with conn.cursor() as cur, cur.copy(copy_sql) as copy:
            for i in range(n):
                entry, data = seal_with_bytes(i + 1, make_item(i), previous)
                copy.write_row(
                    (
                        entry.seq,
                        entry.entry_id,
                        entry.kind,
                        entry.recorded_at,
                        Jsonb(dict(entry.body)),
                        entry.prev_hash,
                        entry.entry_hash,
                        data,
                    )
                )
                frontier.append(leaf_hash(data))
                previous = entry.entry_hash
                if frontier.size == n // 2:
                    older = sign_checkpoint(
                        Checkpoint(ORIGIN, frontier.size, frontier.root()), [signer]
                    )
                if (i + 1) % 100_000 == 0:
                    log(f"  loaded {i + 1} entries")
        conn.execute("UPDATE ledger_head SET seq = %s, entry_hash = %s WHERE id = 1", (n, previous))
        conn.commit()
    loaded = time.perf_counter()
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        for name, definition in QUERY_INDEXES.items():
            conn.execute(f"CREATE INDEX {name} {definition}")
        indexed = time.perf_counter()
        conn.execute("VACUUM ANALYZE ledger_entries")
    newest = sign_checkpoint(Checkpoint(ORIGIN, n, frontier.root()), [signer])
    return newest, older, loaded - started, indexed - loaded


# --- measured in fresh processes -------------------------------------------------------


def in_child(target: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, target, *args))
    proc.start()
    result: dict[str, Any] = queue.get()
    proc.join()
    return result


def _child(queue: Any, target: Callable[..., dict[str, Any]], *args: Any) -> None:
    before, load, cpu = _peak_mb(), os.getloadavg()[0], time.process_time()
    result = target(*args)
    # This process's CPU time: unlike the wall time, hardly moved by what else
    # runs on the machine (the database server's share is not in it).
    result["cpu_seconds"] = round(time.process_time() - cpu, 2)
    result["load_1m"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    result["peak_rss_mb"] = round(_peak_mb(), 1)
    result["rss_growth_mb"] = round(_peak_mb() - before, 1)
    queue.put(result)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def plain_select(url: str) -> dict[str, Any]:
    started, rows = time.perf_counter(), 0
    with psycopg.connect(libpq(url)) as conn, conn.cursor(name="bench") as cur:
        cur.itersize = 5000
        cur.execute(f"SELECT {COLUMNS} FROM ledger_entries ORDER BY seq")
        for _ in cur:
            rows += 1
    return {"rows": rows, "seconds": round(time.perf_counter() - started, 2)}


def copy_stored(url: str) -> dict[str, Any]:
    """What verify_live reads, received and nothing more: its floor."""
    started, rows = time.perf_counter(), 0
    sql = (
        "COPY (SELECT seq, prev_hash, entry_hash, entry_bytes FROM ledger_entries ORDER BY seq) "
        "TO STDOUT (FORMAT binary)"
    )
    with psycopg.connect(url) as conn, conn.cursor() as cur, cur.copy(sql) as copy:
        for _ in copy:
            rows += 1
    return {"rows": rows - 1, "seconds": round(time.perf_counter() - started, 2)}


def verify_live(url: str, note: str, older: str, vkey: str) -> dict[str, Any]:
    import sqlalchemy as sa

    from service.ledger.checkpoint import NoteVerifier
    from service.ledger.postgres import PostgresLedgerReader

    engine = sa.create_engine(url)
    started = time.perf_counter()
    report = PostgresLedgerReader(engine).verify_live(note, NoteVerifier.from_key(vkey), [older])
    seconds = time.perf_counter() - started
    engine.dispose()
    return {"ok": report.ok, "entries": report.entries, "seconds": round(seconds, 2)}


def verify_live_from_columns(url: str, note: str, older: str, vkey: str) -> dict[str, Any]:
    """The way verify --live went before migration 0007 (and still goes when
    the constraint is missing): every entry read as columns, serialised again."""
    import sqlalchemy as sa

    from service.ledger.checkpoint import NoteVerifier
    from service.ledger.postgres import PostgresLedgerReader
    from service.ledger.verify import verify_ledger

    engine = sa.create_engine(url)
    started = time.perf_counter()
    records = PostgresLedgerReader(engine).records()
    report = verify_ledger(records, note, NoteVerifier.from_key(vkey), [older])
    seconds = time.perf_counter() - started
    engine.dispose()
    return {"ok": report.ok, "entries": report.entries, "seconds": round(seconds, 2)}


def verify_file(path: str, note: str, older: str, vkey: str) -> dict[str, Any]:
    from service.ledger.checkpoint import NoteVerifier
    from service.ledger.verify import verify_export

    started = time.perf_counter()
    with open(path, "rb") as handle:
        report = verify_export(handle, note, NoteVerifier.from_key(vkey), [older])
    seconds = time.perf_counter() - started
    return {"ok": report.ok, "entries": report.entries, "seconds": round(seconds, 2)}


def export_file(url: str, path: str, limit: int | None) -> dict[str, Any]:
    import sqlalchemy as sa

    from service.ledger.export import export_ndjson
    from service.ledger.postgres import PostgresLedgerReader

    engine = sa.create_engine(url)
    started, lines = time.perf_counter(), 0
    records: Iterator[ExportRecord] = PostgresLedgerReader(engine).records()
    if limit is not None:
        records = islice(records, limit)
    with open(path, "wb") as handle:
        for line in export_ndjson(records):
            handle.write(line)
            lines += 1
    seconds = time.perf_counter() - started
    engine.dispose()
    return {
        "entries": lines,
        "seconds": round(seconds, 2),
        "entries_per_s": round(lines / seconds),
        "megabytes": round(os.path.getsize(path) / 2**20, 1),
    }


# --- auditor queries ---------------------------------------------------------------------

# Migration 0004's indexes for the auditor queries (service/ledger/query.py): one
# GIN index serves every field and flavor filter, one btree the time range. The
# bulk load drops them and builds them again afterwards, as a restore would.
QUERY_INDEXES = {
    "ix_ledger_entries_body": "ON ledger_entries USING gin (body jsonb_path_ops)",
    "ix_ledger_entries_recorded_at": "ON ledger_entries (recorded_at)",
}


def auditor_queries(url: str, n: int, rounds: int) -> dict[str, Any]:
    """p50/p99 of one page (100 entries) of typical filtered queries through
    the reader, against an unfiltered page of the same size as the baseline."""
    import random
    import statistics

    import sqlalchemy as sa

    from service.ledger.postgres import PostgresLedgerReader
    from service.ledger.query import LedgerQuery

    rng = random.Random(4)
    end = T0 + timedelta(milliseconds=n * 37)

    def at(fraction: float) -> datetime:
        return T0 + (end - T0) * fraction

    def after() -> int | None:
        return rng.randrange(n) if rng.random() < 0.5 else None

    shapes: dict[str, Callable[[], LedgerQuery]] = {
        "unfiltered (baseline)": lambda: LedgerQuery(after_seq=after()),
        "namespace": lambda: LedgerQuery(namespace=f"team-{rng.randrange(17)}", after_seq=after()),
        "namespace+kind": lambda: LedgerQuery(
            namespace=f"team-{rng.randrange(17)}", kinds=("workload.admitted",), after_seq=after()
        ),
        "workload": lambda: LedgerQuery(
            namespace=f"team-{rng.randrange(17)}", workload=f"train-{rng.randrange(n // 3)}"
        ),
        "flavor newest first": lambda: LedgerQuery(flavor="h100", newest_first=True),
        "kind+time range": lambda: LedgerQuery(
            kinds=("workload.finished",), since=at(x := rng.random() * 0.99), until=at(x + 0.01)
        ),
    }
    engine = sa.create_engine(url)
    reader = PostgresLedgerReader(engine)
    results: dict[str, Any] = {}
    everything: list[float] = []
    for name, make in shapes.items():
        timings = []
        for _ in range(rounds):
            query = make()
            started = time.perf_counter()
            reader.query(query)
            timings.append((time.perf_counter() - started) * 1000)
        timings.sort()
        if name != "unfiltered (baseline)":
            everything += timings
        results[name] = {
            "p50_ms": round(statistics.median(timings), 2),
            "p99_ms": round(timings[int(len(timings) * 0.99) - 1], 2),
        }
        log(f"  {name:>22}: {results[name]}")
    everything.sort()
    results["all_filtered_p99_ms"] = round(everything[int(len(everything) * 0.99) - 1], 2)
    engine.dispose()
    return results


# --- the run ---------------------------------------------------------------------------


@contextmanager
def bench_database(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with (
        ExitStack() as stack,
        postgres_server(stack) as server,
        scratch_database(server, purpose="bench_ledger") as scratch,
    ):
        yield scratch


def appends(url: str, seconds: float, results: dict[str, Any]) -> None:
    create_raw_table(url)
    for writers, batch in [(1, 1), (4, 1), (1, 100)]:
        name = f"{'single' if batch == 1 else f'batch{batch}'}_w{writers}"
        baseline = hammer(writers, seconds, ("raw", url, batch))
        ours = hammer(writers, seconds, ("ledger", url, batch))
        results["append"][name] = {
            "ledger_entries_per_s": round(ours),
            "raw_insert_entries_per_s": round(baseline),
            "ratio": round(ours / baseline, 3),
        }
        log(f"  append {name:>12}: ledger {ours:8.0f}/s   raw INSERT {baseline:8.0f}/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="per append case")
    parser.add_argument("--query-rounds", type=int, default=200, help="per query shape")
    parser.add_argument("--database-url")
    args = parser.parse_args()
    n = args.entries
    results: dict[str, Any] = {"bench": "ledger", "entries": n, "append": {}}
    signer = NoteSigner.generate(ORIGIN)[0]
    with bench_database(args.database_url) as url, tempfile.TemporaryDirectory() as tmp:
        upgrade(url)
        engine = make_engine(url, pool_size=8)
        reset_database(engine)
        log("appends through the ledger writer vs plain INSERTs")
        appends(url, args.seconds, results)
        reset_database(engine)
        engine.dispose()

        log(f"sealing and loading {n} entries")
        note, older, load_seconds, index_seconds = fill(url, n, signer)
        results["load_seconds"] = round(load_seconds, 1)
        results["query_index_build_seconds"] = round(index_seconds, 1)

        log("baseline: plain SELECT of every row")
        results["plain_select"] = in_child(plain_select, libpq(url))
        log(f"  {results['plain_select']}")

        log("verify the live ledger")
        live = in_child(verify_live, url, note, older, signer.verifier_key)
        results["verify_live"] = live
        log(f"  {live}")
        log("  its floor: the same rows received by binary COPY, no hashing")
        results["copy_stored"] = in_child(copy_stored, libpq(url))
        log(f"  {results['copy_stored']}")
        log("  the way it went before migration 0007: columns read and serialised again")
        results["verify_live_from_columns"] = in_child(
            verify_live_from_columns, url, note, older, signer.verifier_key
        )
        log(f"  {results['verify_live_from_columns']}")

        path = str(Path(tmp) / "ledger.ndjson")
        log("export a tenth, then everything")
        results["export_tenth"] = in_child(export_file, url, path, n // 10)
        results["export"] = in_child(export_file, url, path, None)
        log(f"  {results['export_tenth']}\n  {results['export']}")

        log("auditor queries")
        results["auditor_query"] = auditor_queries(url, n, args.query_rounds)

        log("verify the export file")
        results["verify_export"] = in_child(verify_file, path, note, older, signer.verifier_key)
        log(f"  {results['verify_export']}")

    select_s = results["plain_select"]["seconds"]
    results["verify_live"]["vs_plain_select"] = round(live["seconds"] / select_s, 2)
    results["export"]["vs_plain_select"] = round(results["export"]["seconds"] / select_s, 2)
    results["verify_target_s"] = 10
    results["cpus"] = os.cpu_count()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
