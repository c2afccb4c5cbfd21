"""Periodic ledger checkpoints: the admission leader signs one every
QM_LEDGER_CHECKPOINT_INTERVAL when the ledger grew, each consistent with the
ones before; a follower signs none; nothing new, nothing signed; no key, no
checkpoints (said once); a rewritten ledger is never signed."""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from service.app.uow import SqlUnitOfWork
from service.ledger import NewLedgerEntry
from service.ledger.checkpoint import DEFAULT_ORIGIN, Checkpoint, NoteSigner, open_checkpoint
from service.ledger.merkle import verify_consistency
from service.ledger.postgres import PostgresCheckpointStore, PostgresLedgerReader
from service.ledger.proofs import LedgerTree
from tests.ledger.tampering import superuser, tamper
from tests.workers.conftest import wait_for, worker_settings
from workers.scheduler import Scheduler

__all__ = ["superuser"]  # a fixture

T0 = datetime(2026, 11, 30, tzinfo=UTC)
INTERVAL = 0.3


@pytest.fixture(scope="module")
def key() -> tuple[NoteSigner, str]:
    return NoteSigner.generate(DEFAULT_ORIGIN)


@contextmanager
def schedulers(
    engine: sa.Engine, database_url: str, broker: str, *holders: str, **settings: Any
) -> Iterator[list[Scheduler]]:
    """Scheduler processes' loops (admission leader, checkpoints) in threads."""
    config = worker_settings(
        database_url,
        broker,
        cycle_interval=0.2,
        ledger_checkpoint_interval=INTERVAL,
        **settings,
    )
    noop_send: Any = lambda *args: None  # noqa: E731
    runners = [
        Scheduler(engine, config, noop_send, holder=h, relay=False, fleet=False) for h in holders
    ]
    threads = [threading.Thread(target=r.run) for r in runners]
    for thread in threads:
        thread.start()
    try:
        yield runners
    finally:
        for runner in runners:
            runner.stop.set()
        for thread in threads:
            thread.join(15)


def append(engine: sa.Engine, n: int) -> None:
    with SqlUnitOfWork(engine) as uow:
        uow.record([NewLedgerEntry(uuid.uuid4(), "quota.changed", {"i": i}, T0) for i in range(n)])
        uow.commit()


def published(engine: sa.Engine, signer: NoteSigner) -> list[Checkpoint]:
    notes = PostgresCheckpointStore(engine).notes()
    return [open_checkpoint(note, signer.verifier()) for note in notes]


def test_the_leader_publishes_when_the_ledger_grew_and_each_extends_the_last(
    engine: sa.Engine, database_url: str, broker: str, key: tuple[NoteSigner, str]
) -> None:
    signer, seed = key
    sizes = []
    with schedulers(engine, database_url, broker, "A", "B", ledger_signing_key=seed) as runners:
        leader = wait_for(lambda: next((r for r in runners if r.leader.lease.leading), None), 60)
        time.sleep(3 * INTERVAL)
        assert published(engine, signer) == [], "an empty ledger: nothing to sign"
        for n in (1, 4, 3, 8):
            append(engine, n)
            sizes.append(sum(sizes[-1:]) + n)
            wait_for(lambda: [c.size for c in published(engine, signer)] == sizes, 60)
        time.sleep(4 * INTERVAL)  # several rounds with nothing new
        checkpoints = published(engine, signer)
        assert [c.size for c in checkpoints] == sizes
        follower = next(r for r in runners if r is not leader)
        assert (leader.checkpoints.published, follower.checkpoints.published) == (4, 0)

    tree = LedgerTree(DEFAULT_ORIGIN)
    tree.catch_up(PostgresLedgerReader(engine))
    for old, new in itertools.pairwise(checkpoints):
        proof = tree.consistency_proof(old.size, new.size)
        assert verify_consistency(old.size, new.size, old.root_hash, new.root_hash, proof.hashes)
    first, last = checkpoints[0], checkpoints[-1]
    proof = tree.consistency_proof(first.size, last.size)
    assert verify_consistency(first.size, last.size, first.root_hash, last.root_hash, proof.hashes)
    notes = PostgresCheckpointStore(engine).notes()
    report = PostgresLedgerReader(engine).verify_live(notes[-1], signer.verifier(), notes[:-1])
    assert report.ok and report.older_checked == 3 and report.unsigned_tail == 0


def test_without_a_signing_key_it_says_so_once_and_signs_nothing(
    engine: sa.Engine, database_url: str, broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="service.ledger.publisher")
    with schedulers(engine, database_url, broker, "A", ledger_signing_key=None) as (runner,):
        wait_for(lambda: runner.leader.lease.leading, 60)
        append(engine, 3)
        time.sleep(4 * INTERVAL)
        assert runner.checkpoints.published == 0
    assert PostgresCheckpointStore(engine).notes() == []
    warnings = [r for r in caplog.records if "QM_LEDGER_SIGNING_KEY is not set" in r.message]
    assert len(warnings) == 1


def test_a_ledger_rewritten_after_a_checkpoint_is_not_signed(
    superuser: sa.Engine,
    database_url: str,
    broker: str,
    key: tuple[NoteSigner, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = superuser
    signer, seed = key
    caplog.set_level(logging.ERROR, logger="service.ledger.publisher")
    append(engine, 5)
    with schedulers(engine, database_url, broker, "A", ledger_signing_key=seed) as (runner,):
        wait_for(lambda: [c.size for c in published(engine, signer)] == [5], 60)
        # History rewritten and sealed again, then grown: every hash and link
        # holds, but the first five are no longer what was signed.
        tamper(
            engine,
            "DELETE FROM ledger_entries",
            "UPDATE ledger_head SET seq = 0, entry_hash = decode(repeat('00', 32), 'hex')",
        )
        append(engine, 7)
        wait_for(lambda: any("refused" in r.message for r in caplog.records), 60)
        time.sleep(3 * INTERVAL)
        assert runner.checkpoints.published == 1
    assert [c.size for c in published(engine, signer)] == [5]
    refusals = [r for r in caplog.records if "refused" in r.message]
    assert len(refusals) == 1, "said once, not every interval"
