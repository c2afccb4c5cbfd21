"""Publishing checkpoints: stored once per size, append-only, each extending
the last — and never a signature on a ledger rewritten behind our back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from service.app.uow import SqlUnitOfWork
from service.ledger import NewLedgerEntry
from service.ledger.checkpoint import CheckpointError, NoteSigner, open_checkpoint
from service.ledger.memory import InMemoryLedger
from service.ledger.postgres import PostgresCheckpointStore, PostgresLedgerReader
from service.ledger.proofs import InMemoryCheckpointStore, LedgerTree, publish_checkpoint
from service.ledger.verify import verify_ledger
from tests.ledger.tampering import superuser, tamper

__all__ = ["superuser"]  # a fixture

T0 = datetime(2026, 11, 29, tzinfo=UTC)
ORIGIN = "qm.test/ledger"


def as_superuser(engine: sa.Engine, statement: str) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        conn.exec_driver_sql(statement)


@pytest.fixture
def store(engine: sa.Engine) -> Iterator[PostgresCheckpointStore]:
    """The harness does not empty this table between tests; we do."""
    as_superuser(engine, "DELETE FROM ledger_checkpoints")
    yield PostgresCheckpointStore(engine)
    as_superuser(engine, "DELETE FROM ledger_checkpoints")


def append(engine: sa.Engine, n: int) -> None:
    with SqlUnitOfWork(engine) as uow:
        uow.record([NewLedgerEntry(uuid.uuid4(), "quota.changed", {"i": i}, T0) for i in range(n)])
        uow.commit()


def test_publish_stores_once_per_size_and_verifies(
    engine: sa.Engine, store: PostgresCheckpointStore
) -> None:
    signer = NoteSigner.generate(ORIGIN)[0]
    reader = PostgresLedgerReader(engine)
    tree = LedgerTree(ORIGIN)
    empty = publish_checkpoint(tree, reader, signer, store)
    assert open_checkpoint(empty, signer.verifier()).size == 0
    append(engine, 5)
    first = publish_checkpoint(tree, reader, signer, store)
    assert publish_checkpoint(tree, reader, signer, store) == first, "nothing new: the same note"
    append(engine, 3)
    second = publish_checkpoint(tree, reader, signer, store)
    assert open_checkpoint(second, signer.verifier()).size == 8
    assert store.notes() == [empty, first, second]
    latest = store.latest()
    assert latest is not None and latest[1] == second
    at_five = store.at(5)
    assert at_five is not None and at_five[1] == first and store.at(6) is None
    report = verify_ledger(reader.records(), second, signer.verifier(), store.notes()[:-1])
    assert report.ok and report.older_checked == 2


def test_a_rewritten_ledger_is_never_signed(
    superuser: sa.Engine, store: PostgresCheckpointStore
) -> None:
    engine = superuser
    signer = NoteSigner.generate(ORIGIN)[0]
    append(engine, 6)
    publish_checkpoint(LedgerTree(ORIGIN), PostgresLedgerReader(engine), signer, store)
    tamper(engine, "UPDATE ledger_entries SET body = '{\"i\": 99}' WHERE seq = 2", guard="drop")
    with pytest.raises(ValueError):  # the content no longer matches its hash
        publish_checkpoint(LedgerTree(ORIGIN), PostgresLedgerReader(engine), signer, store)
    assert len(store.notes()) == 1


def test_published_checkpoints_are_append_only(
    engine: sa.Engine, store: PostgresCheckpointStore
) -> None:
    signer = NoteSigner.generate(ORIGIN)[0]
    append(engine, 2)
    publish_checkpoint(LedgerTree(ORIGIN), PostgresLedgerReader(engine), signer, store)
    for statement in ("UPDATE ledger_checkpoints SET note = ''", "DELETE FROM ledger_checkpoints"):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
            conn.exec_driver_sql(statement)


def test_a_resealed_fork_is_never_signed_either() -> None:
    """Even a rewrite with every hash recomputed: the tree no longer has the
    published root at the published size."""
    signer = NoteSigner.generate(ORIGIN)[0]
    store = InMemoryCheckpointStore()
    honest = InMemoryLedger()
    honest.append([NewLedgerEntry(uuid.uuid4(), "x", {"i": i}, T0) for i in range(6)])
    publish_checkpoint(LedgerTree(ORIGIN), honest, signer, store)
    forked = InMemoryLedger()
    forked.append([NewLedgerEntry(uuid.uuid4(), "x", {"i": -i}, T0) for i in range(8)])
    with pytest.raises(CheckpointError, match="no longer extends"):
        publish_checkpoint(LedgerTree(ORIGIN), forked, signer, store)
    shorter = InMemoryLedger()
    shorter.append(
        [NewLedgerEntry(e.entry_id, e.kind, e.body, e.recorded_at) for e in honest.entries[:4]]
    )
    with pytest.raises(CheckpointError):
        publish_checkpoint(LedgerTree(ORIGIN), shorter, signer, store)
    other = LedgerTree("another.origin")
    with pytest.raises(CheckpointError, match="checkpoints of"):
        publish_checkpoint(other, honest, signer, store)
    latest = store.latest()
    assert latest is not None and latest[0].size == 6
