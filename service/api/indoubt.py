"""Writes whose COMMIT's outcome is unknown (issue 18, finding 6).

A connection that drops while COMMIT is in flight leaves the client not
knowing whether its transaction committed: answering 503 "nothing was
changed" was wrong for the ones that had. So every write the API
acknowledges runs tracked: each transaction it begins notes its id (one
``pg_current_xact_id()``; the connection is gone when it would be needed),
and when the write fails for the database's absence after one began,
Postgres is asked (``pg_xact_status``, made for this) what became of them:

* it answers at once (a backend killed, the server up): what committed is
  read back and answered as the write would have answered (its ``Recover``);
  if nothing did, the 503 "nothing was changed" is now the truth;
* it cannot tell yet (the server down): the request is answered 503
  ``outcome-unknown``, and the Idempotency-Key middleware keeps the key's
  claim and settles it in the background once Postgres answers: the retry
  with the same key then gets the original answer, or runs again if nothing
  committed.

Single writes run through ``InDoubt.call`` (service/api/routes.py); the
submission group commit through ``InDoubtCommit``, which runs again what
is known not to have committed. Both settle through ``Settlements``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from sqlalchemy import Connection, Engine, event, text
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from service.api.group_commit import DATABASE_DOWN
from service.api.recovery import NotCommitted, Recover, submitted
from service.app.errors import AppError
from service.app.submissions import Obj, Outcome, Submission

T = TypeVar("T")

#: Where the Idempotency-Key middleware leaves a list for the request's
#: OutcomeUnknown, if it has one (a mutable list: the scope may be copied).
PENDING = "qm.outcome_pending"

#: The ids of the transactions begun in this context, while tracked. A
#: context variable, not a thread's: a write that fans out to threads (a
#: large bulk's chunks) hands its context to them.
_XIDS: ContextVar[list[int] | None] = ContextVar("qm_tracked_xids", default=None)


class CommitInDoubt(Exception):
    """A write failed with the database after some of its transactions
    began: any of ``xids`` may have committed; ``recover`` reads back what
    did. ``items`` are the submissions of a group commit's batch."""

    def __init__(self, xids: Sequence[int], recover: Recover, items: Sequence[object] = ()) -> None:
        super().__init__(f"commit outcome unknown for transactions {list(xids)}")
        self.xids = tuple(xids)
        self.recover = recover
        self.items = tuple(items)

    def index(self, item: object) -> int:
        return next(i for i, other in enumerate(self.items) if other is item)


class OutcomeUnknown(AppError):
    status, kind, title = 503, "outcome-unknown", "Outcome unknown"

    def __init__(
        self,
        later: Callable[[], Awaitable[Any]],
        render: Callable[[Any], Awaitable[Response]],
    ) -> None:
        super().__init__(
            "the database went away while this request was committing: it may or may not "
            "have taken effect. Retry with the same Idempotency-Key to get its outcome "
            "(without one, a retry meets what it did, if it did: a name taken, a version "
            "moved on)"
        )
        self.later = later
        """The write's result once Postgres says what committed, else None."""
        self.render = render
        """The response the write would have answered with that result."""


@dataclass(frozen=True)
class Settled:
    """What Postgres said: the write's result (None: nothing committed)."""

    value: Any


def track(engine: Engine) -> None:
    """Have ``engine`` note the transaction ids of tracked contexts (once)."""
    if not event.contains(engine, "begin", _note_xid):
        event.listen(engine, "begin", _note_xid)


@contextmanager
def tracked() -> Iterator[list[int]]:
    """The ids of the transactions begun within, as they begin."""
    xids: list[int] = []
    token = _XIDS.set(xids)
    try:
        yield xids
    finally:
        _XIDS.reset(token)


def _note_xid(conn: Connection) -> None:
    """In a tracked context, note the id of the transaction ``conn`` begins."""
    xids = _XIDS.get()
    if xids is None:
        return
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None
    cursor = dbapi.cursor()
    try:
        cursor.execute("SELECT pg_current_xact_id()::text")
        row = cursor.fetchone()
    finally:
        cursor.close()
    assert row is not None
    xids.append(int(row[0]))


# The statuses of transactions; an id at or past the snapshot's xmax was
# never assigned by the server that answers (a crash lost it): not committed.
_STATUS = text(
    "SELECT x::text, CASE WHEN x >= pg_snapshot_xmax(pg_current_snapshot()) THEN 'aborted' "
    "ELSE pg_xact_status(x) END FROM unnest(CAST(CAST(:xids AS text[]) AS xid8[])) AS x"
)


def settle(engine: Engine, doubt: CommitInDoubt) -> Settled | None:
    """What the doubtful write left, read back by its ``recover`` from the
    transactions that committed; None while Postgres cannot tell."""
    try:
        with engine.connect() as conn:
            statuses: dict[str, str | None] = {
                str(x): status
                for x, status in conn.execute(_STATUS, {"xids": [str(x) for x in doubt.xids]})
            }
            if any(status not in ("committed", "aborted") for status in statuses.values()):
                return None  # still in progress, or too old to say
            # Rows carry the inserting transaction's 32-bit id (xmin).
            committed = [int(x) % (1 << 32) for x, s in statuses.items() if s == "committed"]
            return Settled(doubt.recover(conn, committed))
    except DATABASE_DOWN:
        return None


class InDoubt:
    """Runs a write so that a COMMIT cut short is settled, not misreported."""

    #: Tries of ``pg_xact_status`` before the request is answered
    #: ``outcome-unknown`` (a killed backend's transaction ends within
    #: milliseconds; a server that is down refuses at once).
    TRIES, PAUSE = 4, 0.05

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        track(engine)

    def call(self, recover: Recover, write: Callable[..., T], *args: Any) -> T:
        """``write(*args)`` (blocking: call it in a thread). Failed for the
        database after a transaction began: its result read back if it
        committed, its error if nothing did, CommitInDoubt while unknown."""
        with tracked() as xids:
            try:
                return write(*args)
            except DATABASE_DOWN as error:
                if not xids:
                    raise  # no transaction began: nothing can have committed
                cause = error
        doubt = CommitInDoubt(xids, recover)
        settled = self.settle_now(doubt)
        if settled is None:
            raise doubt from cause
        if settled.value is None:
            raise cause  # known: nothing committed, as its 503 says
        result: T = settled.value
        return result

    def settle_now(self, doubt: CommitInDoubt) -> Settled | None:
        """Settled within a few quick tries, or None."""
        for _ in range(self.TRIES):
            settled = settle(self._engine, doubt)
            if settled is not None:
                return settled
            time.sleep(self.PAUSE)
        return None


class InDoubtCommit:
    """``submit_parsed`` for the group commit, settling an unknown outcome:
    what is known not to have committed runs once more."""

    def __init__(
        self, in_doubt: InDoubt, commit: Callable[[Sequence[Submission]], list[Outcome]]
    ) -> None:
        self._in_doubt = in_doubt
        self._commit = commit

    def __call__(self, submissions: Sequence[Submission]) -> list[Outcome]:
        return self._attempt(submissions, again=True)

    def _attempt(self, submissions: Sequence[Submission], again: bool) -> list[Outcome]:
        with tracked() as xids:
            try:
                return self._commit(submissions)
            except DATABASE_DOWN as error:
                if not xids:
                    raise  # no transaction began: nothing can have committed
                cause = error
        doubt = CommitInDoubt(xids, submitted(submissions), submissions)
        settled = self._in_doubt.settle_now(doubt)
        if settled is None:
            raise doubt from cause
        found: list[Obj | None] = settled.value
        rest = [s for s, obj in zip(submissions, found, strict=True) if obj is None]
        if not again:
            refused = NotCommitted("the database failed this request twice; nothing was changed")
            return [obj if obj is not None else refused for obj in found]
        outcomes = iter(self._attempt(rest, again=False) if rest else [])
        return [obj if obj is not None else next(outcomes) for obj in found]


class Settlements:
    """Doubtful writes settled in the background, each once (a group
    commit's batch is one), when Postgres answers; given up after
    ``give_up`` seconds (then: not committed, as far as anyone will learn
    from this process)."""

    def __init__(self, engine: Engine, interval: float = 0.5, give_up: float = 600) -> None:
        self._engine = engine
        self._interval = interval
        self._give_up = give_up
        self._tasks: dict[int, asyncio.Task[Any]] = {}

    async def outcome(self, doubt: CommitInDoubt) -> Any:
        """The write's result (its ``recover``'s), None if nothing committed."""
        task = self._tasks.get(id(doubt))
        if task is None:
            task = self._tasks[id(doubt)] = asyncio.get_running_loop().create_task(
                self._settle(doubt)
            )
            task.add_done_callback(lambda _: self._tasks.pop(id(doubt), None))
        return await asyncio.shield(task)

    async def item_outcome(self, doubt: CommitInDoubt, item: object) -> Any:
        """The outcome of one submission of a batch: its object, or None."""
        found = await self.outcome(doubt)
        return None if found is None else found[doubt.index(item)]

    async def _settle(self, doubt: CommitInDoubt) -> Any:
        deadline = time.monotonic() + self._give_up
        while time.monotonic() < deadline:
            settled = await anyio.to_thread.run_sync(settle, self._engine, doubt)
            if settled is not None:
                return settled.value
            await asyncio.sleep(self._interval)
        return None


Render = Callable[[T], Awaitable[Response]]
"""The response a write answers with its result."""


async def settled(
    request: Request, recover: Recover, render: Render[T], write: Callable[..., T], *args: Any
) -> Response:
    """The answer to ``write(*args)``, run in a thread, through ``render``.
    Should the database go away while it commits, Postgres is asked what
    committed (``InDoubt``): what did is answered as if it had not gone,
    nothing is the 503 it is, and while unknown the 503 says so, for the
    Idempotency-Key middleware to settle with ``recover`` and ``render``
    once Postgres answers. Every write but a single submission (the group
    commit's) goes through here."""
    in_doubt: InDoubt = request.app.state.in_doubt
    try:
        result = await run_in_threadpool(in_doubt.call, recover, write, *args)
    except CommitInDoubt as doubt:
        settlements: Settlements = request.app.state.settlements
        raise OutcomeUnknown(functools.partial(settlements.outcome, doubt), render) from None
    return await render(result)
