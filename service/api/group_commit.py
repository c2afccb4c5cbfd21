"""Group commit of single submissions within one API process.

A submission is durable only once its transaction's WAL is flushed, and
every submission takes its turn at the ledger's tip lock from sealing its
entry until that flush (service/ledger/postgres.py): one at a time, a
process commits at most one submission per flush. So submissions that
arrive while a unit of work is committing wait for it, and are then
committed together in the next one (the batch is whatever queued
meanwhile, up to ``max_batch``: no timer, so a lone submission is not
delayed). A second unit of work starts beside the first only when at least
``spill`` submissions wait: then one is resolved and encoded while the
other waits for Postgres. Two small units would only take turns at the
ledger's tip lock, each with its own WAL flush (bench/api.py: with two
always, 16 clients got 0.25 of the bare baseline instead of 0.29-0.37).
Each request still gets its own answer, its object or its own
error (``SubmissionService.submit_parsed``); nothing is acknowledged
before its unit of work has committed.

A batch that fails for a reason of one item's (a value that validation let
through and the commit cannot hold) is split in halves and each retried,
until the failing item is alone: the others commit, and only that item's
request gets the error. An error in ``shared`` (the database down) is every
item's at once.

The same batching serves the Idempotency-Key store: claims that arrive
together are made in one transaction, and so are the stored responses
(service/api/middleware.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import anyio
import psycopg
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

Item = TypeVar("Item")
Result = TypeVar("Result")
log = logging.getLogger(__name__)

#: Errors that are no item's: the database refused the connection or the
#: statement for every item of the batch alike, a connection it closed was
#: used ("the connection is closed" is an InterfaceError), or no connection
#: of the pool came free in time.
DATABASE_DOWN: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    PoolTimeout,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


class GroupCommit(Generic[Item, Result]):
    """``commit(items)`` answers each item with its own result, in order."""

    def __init__(
        self,
        commit: Callable[[Sequence[Item]], list[Result]],
        max_batch: int = 256,
        committers: int = 2,
        spill: int = 16,
        shared: tuple[type[Exception], ...] = (),
    ) -> None:
        self._commit = commit
        self._shared = shared
        self._max_batch = max_batch
        self._committers = committers
        self._spill = spill
        self._running = 0
        self._waiting: deque[tuple[Item, asyncio.Future[Result]]] = deque()

    @property
    def waiting(self) -> int:
        """Items queued for a unit of work that has not started."""
        return len(self._waiting)

    async def submit(self, item: Item) -> Result:
        """The item's result, once the unit of work it rode in committed."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._running == 0 or (
            self._running < self._committers and len(self._waiting) >= self._spill
        ):
            self._running += 1
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        """Commit what waits, batch after batch, until nothing does."""
        try:
            while self._waiting:
                batch = [
                    self._waiting.popleft() for _ in range(min(self._max_batch, len(self._waiting)))
                ]
                await self._run(batch)
        finally:
            self._running -= 1

    async def _run(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        try:
            outcomes = await anyio.to_thread.run_sync(self._commit, [s for s, _ in batch])
        except Exception as error:
            if len(batch) > 1 and not isinstance(error, self._shared):
                # One item's, most likely: a unit of work that raised has
                # rolled back, so each half is tried again on its own.
                log.warning("a batch of %d failed (%r); retrying it in halves", len(batch), error)
                half = len(batch) // 2
                await self._run(batch[:half])
                await self._run(batch[half:])
                return
            for _, future in batch:  # e.g. the database is down: every request answers it
                if not future.done():
                    future.set_exception(error)
            return
        except BaseException:  # cancelled: the server is going away
            for _, future in batch:
                future.cancel()
            raise
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if not future.done():  # its client may have gone
                future.set_result(outcome)
