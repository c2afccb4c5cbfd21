"""Chaos through the real processes: Redis and then Postgres restarted while
gangs are being submitted (invariant 7 of DESIGN.md).

The servers are private to this test (``redis-server`` and a ``pg_ctl``
cluster on free ports, tests/workers/stack.py): the ones at 6379 and 5432
are shared with other tests and are never touched. Redis runs without
persistence, so its restart loses every message it held — Redis holds only
hints. Postgres is stopped with ``-m fast`` (every connection cut) and
started again on the same port and data.

Proves: every submission the API acknowledged (201) is admitted, run and
finished once; no admission's job is created twice on a member; while the
database is down the API answers 503 (never 500) and afterwards 201 again,
with the same API, worker and scheduler processes (nobody restarted them);
the Celery worker consumes and the scheduler admits after both restarts.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from service.app.bootstrap import make_engine
from service.app.idempotency import (
    IN_FLIGHT_LEASE,
    Claimed,
    IdempotencyStore,
    InFlight,
    Mismatch,
    Replay,
)
from service.app.migrate import upgrade
from service.runtime.embedded import free_port
from tests.waiting import wait_for as wait_until
from tests.workers.invariants import ledger_matches_events
from tests.workers.stack import (
    FAST,
    MemberWatch,
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
from workers.fleet import FleetLoop
from workers.settings import WorkerSettings

pytestmark = pytest.mark.timeout(240)

NAMESPACE = "team-a"


class Submitter(threading.Thread):
    """Submits gangs one after another, each retried with its
    Idempotency-Key until acknowledged; keeps every answer it got."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(daemon=True, name="submitter")
        self.stack = stack
        self.stop = threading.Event()
        self.acknowledged: list[str] = []
        self.answers: Counter[int | str] = Counter()
        self.failures: list[str] = []

    def run(self) -> None:
        with self.stack.client(timeout=5) as api:
            number = 0
            while not self.stop.is_set():
                name = f"s{number:03d}"
                if self._submit(api, name):
                    self.acknowledged.append(name)
                    number += 1
                self.stop.wait(0.15)

    def _submit(self, api: httpx.Client, name: str) -> bool:
        body = gang(name, 8, 50)
        while True:
            try:
                response = api.post(
                    f"/v1/namespaces/{NAMESPACE}/workloads",
                    json=body,
                    headers={"Idempotency-Key": f"chaos-{name}"},
                )
            except httpx.TransportError as error:
                self.answers[type(error).__name__] += 1
            else:
                self.answers[response.status_code] += 1
                if response.status_code == 201:
                    return True
                # 503, or 409 "in flight" while a commit cut short is settled:
                # both say retry later with the same key.
                in_flight = response.status_code == 409 and "in-flight" in response.text
                if response.status_code != 503 and not in_flight:
                    self.failures.append(f"{name}: {response.status_code} {response.text[:300]}")
                    return False
            if self.stop.wait(0.3):
                return False


def _count(engine: sa.Engine, sql: str, **params: object) -> int:
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(sql), params).scalar_one())
    except sa.exc.OperationalError:
        return -1


def _diagnosis(engine: sa.Engine) -> str:
    """What the centre holds, for a failure's message."""
    engine.dispose()  # never a connection a restart broke
    with engine.connect() as conn:
        states = conn.execute(
            sa.text(
                "SELECT coalesce(status->>'state', 'Pending'), count(*) FROM resources "
                "WHERE kind = 'Workload' GROUP BY 1"
            )
        ).all()
        clusters = conn.execute(
            sa.text(
                "SELECT name, status->>'state', status->>'lastHeartbeat' FROM resources "
                "WHERE kind = 'Cluster'"
            )
        ).all()
        unsent = conn.execute(
            sa.text("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        ).scalar_one()
        processed = conn.execute(
            sa.text(
                "SELECT consumer, outcome, count(*), max(processed_at) FROM processed_messages "
                "GROUP BY 1, 2"
            )
        ).all()
    return f"states {states}, clusters {clusters}, unsent {unsent}, processed {processed}"


def _until(
    condition: Callable[[], object], timeout: float, what: str, stack: Stack, engine: sa.Engine
) -> None:
    """``wait_until``, failing with what the centre holds and every log."""
    try:
        wait_until(condition, timeout, what)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_diagnosis(engine)}\n{stack.logs(40)}") from None


def _finished(engine: sa.Engine, names: list[str]) -> int:
    return _count(
        engine,
        "SELECT count(*) FROM resources WHERE kind = 'Workload' AND namespace = :ns "
        "AND name = ANY(:names) AND status->>'state' = 'Finished'",
        ns=NAMESPACE,
        names=names,
    )


def test_the_fleet_loop_outlives_a_database_it_cannot_reach(redis_url: str) -> None:
    """Its passes fail while the database is down, and it keeps trying (it
    used to end, leaving a leader that never synced or reconciled again)."""
    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/qm"
    engine = make_engine(nowhere, pool_size=1)
    config = WorkerSettings(database_url=nowhere, broker_url=redis_url, resync_interval=0.1)
    fleet = FleetLoop(engine, config, watch=False)
    thread = threading.Thread(target=fleet.run, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)  # some ten passes, each failing to connect
        assert thread.is_alive()
    finally:
        fleet.halt()
        thread.join(10)
        engine.dispose()
    assert not thread.is_alive()


def test_an_idempotency_key_whose_request_died_in_flight_is_claimed_again_after_its_lease(
    engine: sa.Engine,
) -> None:
    """A request that claimed its key and never finished (its process died,
    or Postgres went away before the response was stored) leaves a claim
    without a response: 409 "in flight" while it may still be running, then
    the retry runs again, not 409 for the key's whole lifetime."""
    store = IdempotencyStore(engine, ttl_seconds=24 * 3600)
    assert isinstance(store.claim("alice", "k", b"request"), Claimed)
    assert isinstance(store.claim("alice", "k", b"request"), InFlight)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE idempotency_keys SET created_at = created_at - :lease"),
            {"lease": IN_FLIGHT_LEASE + timedelta(seconds=1)},
        )
    assert isinstance(store.claim("alice", "k", b"other request"), Mismatch)
    assert isinstance(store.claim("alice", "k", b"request"), Claimed)
    assert isinstance(store.claim("alice", "k", b"request"), InFlight)
    store.finish("alice", "k", 201, [], b"{}")
    assert store.claim("alice", "k", b"request") == Replay(201, [], b"{}")


@pytest.fixture
def servers() -> Iterator[tuple[PrivatePostgres, PrivateRedis, str]]:
    with private_postgres() as postgres, private_redis() as redis_server:
        admin = sa.create_engine(postgres.server_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql("CREATE DATABASE qm")
        admin.dispose()
        url = postgres.url("qm")
        upgrade(url)
        yield postgres, redis_server, url


def _restart(redis_server: PrivateRedis) -> datetime:
    """Kill Redis (everything it held is lost) and start it again."""
    redis_server.stop()
    time.sleep(2)
    redis_server.start()
    return datetime.now(UTC)


def _outage(postgres: PrivatePostgres, stack: Stack) -> Counter[str]:
    """Stop Postgres, hear what readers and writers get from the API while
    it is down, start it again."""
    probes: Counter[str] = Counter()
    postgres.stop("fast")
    with stack.client(timeout=5) as api:
        for _ in range(6):
            listed = api.get(f"/v1/namespaces/{NAMESPACE}/workloads")
            posted = api.post(f"/v1/namespaces/{NAMESPACE}/workloads", json=gang("p", 8, 50))
            probes[f"GET {listed.status_code}"] += 1
            probes[f"POST {posted.status_code}"] += 1
            time.sleep(0.5)
    postgres.start()
    return probes


_AFTER = {
    "admitted": "SELECT count(*) FROM events WHERE type = 'WorkloadAdmitted' AND recorded_at > :at",
    "reconciled": "SELECT count(*) FROM processed_messages WHERE outcome = 'done' "
    "AND consumer = 'reconcile.cluster' AND processed_at > :at",
}


def _after(engine: sa.Engine, at: datetime) -> dict[str, int]:
    """What the scheduler and the Celery worker did after ``at``."""
    with engine.connect() as conn:
        return {
            what: conn.execute(sa.text(sql), {"at": at}).scalar_one()
            for what, sql in _AFTER.items()
        }


def _states(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT name, status->>'state' FROM resources "
                "WHERE kind = 'Workload' AND namespace = :ns"
            ),
            {"ns": NAMESPACE},
        ).all()
    return {name: state for name, state in rows}


def test_redis_and_postgres_restarts_lose_nothing_acknowledged_and_run_no_job_twice(
    servers: tuple[PrivatePostgres, PrivateRedis, str], tmp_path: Path
) -> None:
    postgres, redis_server, url = servers
    # 3 clusters x 1 island x 4 nodes: 96 GPUs; one team with all of it.
    fleet = write_fleet(tmp_path / "fleet.yaml", {f"m{i}": (1, 4) for i in (1, 2, 3)})
    manifests = [*base_manifests(), team_queue(NAMESPACE, 96), local_queue(NAMESPACE, NAMESPACE)]
    engine = make_engine(url, pool_size=2)
    with Stack(tmp_path, url, redis_server.url, FAST) as stack:
        stack.start(fleet, 3, manifests, time_scale=0.01)
        processes = {c.name: c.pid for c in stack.supervisor.children}
        submitter = Submitter(stack)
        with MemberWatch(stack.members, stack.kubeconfig) as members:
            submitter.start()
            _until(
                lambda: len(submitter.acknowledged) >= 10, 60, "first submissions", stack, engine
            )
            redis_back = _restart(redis_server)
            _until(lambda: len(submitter.acknowledged) >= 20, 60, "after Redis", stack, engine)
            # The Celery worker reconnected by itself: it consumes what the
            # relay publishes to the new Redis.
            _until(
                lambda: all(_after(engine, redis_back).values()), 60, "work after", stack, engine
            )
            probes = _outage(postgres, stack)
            postgres_back = datetime.now(UTC)
            engine.dispose()  # the test's own connections died with the server
            acknowledged = len(submitter.acknowledged)
            _until(
                lambda: len(submitter.acknowledged) >= acknowledged + 10,
                120,
                f"submissions after Postgres ({submitter.answers})",
                stack,
                engine,
            )
            submitter.stop.set()
            submitter.join(10)
            names = list(submitter.acknowledged)
            _until(lambda: _finished(engine, names) == len(names), 180, "finished", stack, engine)
            alive = {c.name: (c.pid, c.alive) for c in stack.supervisor.children}
    # While the database was down: 503, never 500; afterwards 201 again.
    assert probes == {"GET 503": 6, "POST 503": 6}, probes
    assert submitter.failures == []
    assert set(submitter.answers) <= {201, 409, 503, "ReadTimeout", "ConnectError"}, (
        submitter.answers
    )
    assert submitter.answers[503] > 0
    # Nobody restarted anything, and each part worked on after both restarts.
    assert alive == {name: (pid, True) for name, pid in processes.items()}
    after_postgres = _after(engine, postgres_back)
    assert all(after_postgres.values()), after_postgres
    # Nothing acknowledged was lost (a 503 changed nothing), and each ran once.
    assert len(names) >= 30
    states = _states(engine)
    assert set(states) == set(names)
    assert set(states.values()) == {"Finished"}
    created = Counter(job.admission for job in members.job_history)
    assert max(created.values()) == 1, created.most_common(3)
    problems, kinds = ledger_matches_events(engine)
    assert problems == [], problems[:10]
    assert kinds["workload.finished"] == len(names)
    assert kinds["workload.admitted"] == len(members.job_history)
    assert _count(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0
    engine.dispose()
