"""Submissions whose COMMIT's outcome is unknown (issue 18, finding 6).

A connection that drops while COMMIT is in flight leaves the client not
knowing whether its transaction committed: answering 503 "nothing was
changed" was wrong for the ones that had. So each unit of work of the
submission group commit notes its transaction id when it begins (one
``pg_current_xact_id()``; the connection is gone when it would be needed),
and when a batch fails for the database's absence after one began, Postgres
is asked (``pg_xact_status``, made for this) what became of it:

* it answers at once (a backend killed, the server up): what committed is
  answered 201 with the object as it was created, the rest is run again;
* it cannot tell yet (the server down): the request is answered 503
  ``outcome-unknown``, and the Idempotency-Key middleware keeps the key's
  claim and settles it in the background once Postgres answers: the retry
  with the same key then gets the original 201, or runs again if nothing
  committed. A retry without a key meets the name taken (409), as any.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import anyio
from sqlalchemy import Connection, Engine, event, text
from starlette.responses import Response

from service.api.group_commit import DATABASE_DOWN
from service.app.errors import AppError
from service.app.kinds import KINDS
from service.app.resources import stream_name, to_object
from service.app.submissions import Obj, Outcome, Submission

#: Where the Idempotency-Key middleware leaves a list for the request's
#: OutcomeUnknown, if it has one (a mutable list: the scope may be copied).
PENDING = "qm.outcome_pending"

_tracking = threading.local()


class CommitInDoubt(Exception):
    """A batch failed with the database after some of its transactions
    began: any of ``xids`` may have committed."""

    def __init__(self, submissions: Sequence[Submission], xids: Sequence[int]) -> None:
        super().__init__(f"commit outcome unknown for transactions {list(xids)}")
        self.submissions = list(submissions)
        self.xids = tuple(xids)


class OutcomeUnknown(AppError):
    status, kind, title = 503, "outcome-unknown", "Outcome unknown"

    def __init__(
        self,
        later: Callable[[], Awaitable[Obj | None]],
        render: Callable[[Obj], Response],
    ) -> None:
        super().__init__(
            "the database went away while this request was committing: it may or may not "
            "have been stored. Retry with the same Idempotency-Key to get its outcome "
            "(without one, a retry of a stored submission meets its name taken: 409)"
        )
        self.later = later
        """The created object once Postgres says it committed, else None."""
        self.render = render


class NotCommitted(AppError):
    """Known not to have committed, and not run again."""

    status, kind, title = 503, "database-unavailable", "Database unavailable"


class InDoubtCommit:
    """``submit_parsed`` for the group commit, settling an unknown outcome."""

    #: Tries of ``pg_xact_status`` before the request is answered
    #: ``outcome-unknown`` (a killed backend's transaction ends within
    #: milliseconds; a server that is down refuses at once).
    TRIES, PAUSE = 4, 0.05

    def __init__(self, engine: Engine, commit: Callable[[Sequence[Submission]], list[Outcome]]):
        self._engine = engine
        self._commit = commit
        event.listen(engine, "begin", _note_xid)

    def __call__(self, submissions: Sequence[Submission]) -> list[Outcome]:
        return self._attempt(submissions, again=True)

    def _attempt(self, submissions: Sequence[Submission], again: bool) -> list[Outcome]:
        xids: list[int] = []
        _tracking.xids = xids
        try:
            return self._commit(submissions)
        except DATABASE_DOWN as error:
            if not xids:
                raise  # no transaction began: nothing can have committed
            doubt = CommitInDoubt(submissions, xids)
            cause: Exception = error
        finally:
            _tracking.xids = None
        for _ in range(self.TRIES):
            settled = settle(self._engine, doubt)
            if settled is not None:
                break
            time.sleep(self.PAUSE)
        else:
            raise doubt from cause
        rest = [s for s, obj in zip(submissions, settled, strict=True) if obj is None]
        if not again:
            refused = NotCommitted("the database failed this request twice; nothing was changed")
            return [obj if obj is not None else refused for obj in settled]
        outcomes = iter(self._attempt(rest, again=False) if rest else [])
        return [obj if obj is not None else next(outcomes) for obj in settled]


def _note_xid(conn: Connection) -> None:
    """On a tracked thread, note the id of the transaction ``conn`` begins."""
    xids: list[int] | None = getattr(_tracking, "xids", None)
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
# The submissions' events that committed transactions wrote (xmin is the
# inserting transaction's 32-bit id).
_SUBMITTED = text(
    "SELECT stream, version, data FROM events WHERE stream = ANY(:streams) "
    "AND type = 'WorkloadSubmitted' AND xmin::text::bigint = ANY(:xmins)"
)


def settle(engine: Engine, doubt: CommitInDoubt) -> list[Obj | None] | None:
    """Each submission's created object if one of the batch's transactions
    committed it, else None; None overall while Postgres cannot tell."""
    try:
        with engine.connect() as conn:
            statuses: dict[str, str | None] = {
                str(x): status
                for x, status in conn.execute(_STATUS, {"xids": [str(x) for x in doubt.xids]})
            }
            if any(status not in ("committed", "aborted") for status in statuses.values()):
                return None  # still in progress, or too old to say
            committed = [int(x) % (1 << 32) for x, s in statuses.items() if s == "committed"]
            streams = {
                stream_name("Workload", s.namespace, s.workload.metadata.name): i
                for i, s in enumerate(doubt.submissions)
            }
            rows = (
                conn.execute(_SUBMITTED, {"streams": list(streams), "xmins": committed}).all()
                if committed
                else []
            )
    except DATABASE_DOWN:
        return None
    found: list[Obj | None] = [None] * len(doubt.submissions)
    for stream, version, data in rows:
        found[streams[stream]] = _created(version, data)
    return found


def _created(version: int, data: dict[str, Any]) -> Obj:
    """The object a submission's 201 carried, from its WorkloadSubmitted
    event (which holds what SubmissionService._append answered with)."""
    row = {
        **data,
        "resource_version": version,
        "created_at": datetime.fromisoformat(data["created_at"]),
    }
    return to_object(KINDS["workloads"], row)


class Settlements:
    """In-doubt batches settled in the background, each once, when Postgres
    answers; given up after ``give_up`` seconds (then: not committed, as far
    as anyone will learn from this process)."""

    def __init__(self, engine: Engine, interval: float = 0.5, give_up: float = 600) -> None:
        self._engine = engine
        self._interval = interval
        self._give_up = give_up
        self._tasks: dict[int, asyncio.Task[list[Obj | None]]] = {}

    async def outcome(self, doubt: CommitInDoubt, submission: Submission) -> Obj | None:
        task = self._tasks.get(id(doubt))
        if task is None:
            task = self._tasks[id(doubt)] = asyncio.get_running_loop().create_task(
                self._settle(doubt)
            )
            task.add_done_callback(lambda _: self._tasks.pop(id(doubt), None))
        results = await asyncio.shield(task)
        index = next(i for i, s in enumerate(doubt.submissions) if s is submission)
        return results[index]

    async def _settle(self, doubt: CommitInDoubt) -> list[Obj | None]:
        deadline = time.monotonic() + self._give_up
        while time.monotonic() < deadline:
            settled = await anyio.to_thread.run_sync(settle, self._engine, doubt)
            if settled is not None:
                return settled
            await asyncio.sleep(self._interval)
        return [None] * len(doubt.submissions)
