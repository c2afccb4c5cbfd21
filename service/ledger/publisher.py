"""Periodic checkpoints: sign the ledger's tree head every interval, if it grew.

The scheduler runs one :class:`CheckpointPublisher` per process in a thread
and lets it publish only while that process leads admission
(workers/scheduler.py), so one process signs at a time. Even two at once
would be harmless: a size is stored once (``ON CONFLICT DO NOTHING``) and its
root is the same whoever computes it.

Each round catches the in-memory tree up with the entries appended since the
last one (the first round reads the whole ledger) and calls
:func:`~service.ledger.proofs.publish_checkpoint`, which refuses to sign a
ledger that no longer extends the latest published checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from service.ledger.checkpoint import DEFAULT_ORIGIN, CheckpointError, NoteSigner
from service.ledger.postgres import PostgresCheckpointStore, PostgresLedgerReader
from service.ledger.proofs import LedgerTree, publish_checkpoint

log = logging.getLogger(__name__)

#: How often a publisher that does not lead looks whether it leads now.
_LEADER_POLL = 1.0


class CheckpointPublisher:
    def __init__(
        self,
        engine: Engine,
        signing_key: str | None,
        interval: float,
        origin: str = DEFAULT_ORIGIN,
    ) -> None:
        self._reader = PostgresLedgerReader(engine)
        self._store = PostgresCheckpointStore(engine)
        self._signing_key = signing_key or None
        self._interval = interval
        self._origin = origin
        self._tree = LedgerTree(origin)
        self._refused: str | None = None
        self.stop = threading.Event()
        #: Checkpoints this publisher signed and stored (not the sizes it
        #: found already published).
        self.published = 0

    def run(self, leading: Callable[[], bool]) -> None:
        """Until :meth:`halt`: while ``leading()``, publish at once and then
        every interval. Without a signing key, or with an interval of 0, says
        so once and returns."""
        if self._interval <= 0:
            log.info("periodic ledger checkpoints are off (QM_LEDGER_CHECKPOINT_INTERVAL=0)")
            return
        signer = self._signer()
        if signer is None:
            return
        due = 0.0
        while not self.stop.is_set():
            if not leading():
                due = 0.0  # a new leader publishes at once
            elif time.monotonic() >= due:
                due = time.monotonic() + self._interval
                try:
                    self.publish(signer)
                except Exception:
                    log.exception("ledger checkpoint failed; trying again in %ss", self._interval)
            self.stop.wait(min(self._interval, _LEADER_POLL))

    def halt(self) -> None:
        self.stop.set()

    def publish(self, signer: NoteSigner) -> str | None:
        """Sign and store a checkpoint of the whole ledger if it grew since
        the latest one; the new note, or None."""
        latest = self._store.latest()
        if latest is None and self._reader.head()[0] == 0:
            return None  # nothing to vouch for yet
        try:
            note = self._publish(signer)
        except CheckpointError as error:
            if str(error) != self._refused:  # say it once, not every interval
                log.error("ledger checkpoint refused, nothing signed: %s", error)
                self._refused = str(error)
            return None
        self._refused = None
        if latest is not None and latest[1] == note:
            return None
        self.published += 1
        log.info("ledger checkpoint published: %s entries", self._tree.size)
        return note

    def _publish(self, signer: NoteSigner) -> str:
        try:
            return publish_checkpoint(self._tree, self._reader, signer, self._store)
        except CheckpointError:
            raise
        except ValueError as error:
            # The stored ledger no longer continues our tree (rewritten, or
            # emptied): read it again from the start; publish_checkpoint then
            # signs it only if it still extends the published checkpoints.
            if self._refused is None:  # not again while the refusal stands
                log.warning("ledger tree rebuilt from the start: %s", error)
            self._tree = LedgerTree(self._origin)
        try:
            return publish_checkpoint(self._tree, self._reader, signer, self._store)
        except CheckpointError:
            raise
        except ValueError as error:
            raise CheckpointError(f"the stored ledger does not verify: {error}") from error

    def _signer(self) -> NoteSigner | None:
        if not self._signing_key:
            log.warning(
                "QM_LEDGER_SIGNING_KEY is not set: no periodic ledger checkpoints "
                "(see `quartermaster ledger keygen`)"
            )
            return None
        try:
            return NoteSigner.from_seed(self._origin, self._signing_key)
        except CheckpointError as error:
            log.error("QM_LEDGER_SIGNING_KEY is unusable, no periodic checkpoints: %s", error)
            return None
