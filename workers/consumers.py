"""Consumers of outbox messages: each effect exactly once, however often the
broker delivers the message.

A delivery goes through three short transactions at most:

1. count it (``processed_messages.deliveries + 1``, committed at once, so a
   delivery that kills the worker still counts);
2. lock the message's row, skip if ``processed_at`` is set, otherwise run the
   handler inside the same unit of work and set ``processed_at`` with it — the
   effect and the record that it happened commit together or not at all;
3. past ``max_deliveries``, or on a failure of the last allowed delivery,
   append a ``MessageDeadLettered`` event to ``deadletter-<topic>`` instead.

Hints that live outside Postgres (a Redis wake-up) run after the commit and
may be lost: nothing depends on them but latency.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from uuid import UUID, uuid5

from sqlalchemy import Engine, text

from service.app.uow import SqlUnitOfWork
from service.eventstore.port import ANY_VERSION, EventMetadata, NewEvent

log = logging.getLogger(__name__)

DEAD_LETTERED = "MessageDeadLettered"
ACTOR = "system:workers"


@dataclass(frozen=True)
class Delivery:
    message_id: UUID
    topic: str
    payload: Mapping[str, Any] = field(default_factory=dict)


AfterCommit = Callable[[], None]
Handler = Callable[[SqlUnitOfWork, Delivery], AfterCommit | None]
"""Runs inside the unit of work that marks the message processed; may return
a hint to send once that commits."""

HANDLERS: dict[str, Handler] = {}


def consumer(topic: str) -> Callable[[Handler], Handler]:
    """Register the one handler of ``topic``."""

    def register(handler: Handler) -> Handler:
        if topic in HANDLERS and HANDLERS[topic] is not handler:
            raise ValueError(f"topic {topic!r} already has a consumer")
        HANDLERS[topic] = handler
        return handler

    return register


class Outcome(StrEnum):
    DONE = "done"
    DUPLICATE = "duplicate"
    DEAD = "dead"


class RetryLater(Exception):
    """The handler failed; deliver again after ``countdown`` seconds."""

    def __init__(self, countdown: float, cause: BaseException) -> None:
        super().__init__(f"retry in {countdown:g}s: {cause!r}")
        self.countdown = countdown
        self.cause = cause


_COUNT = text(
    "INSERT INTO processed_messages (consumer, message_id, deliveries) "
    "VALUES (:consumer, :id, 1) "
    "ON CONFLICT (consumer, message_id) DO UPDATE "
    "SET deliveries = processed_messages.deliveries + 1 "
    "RETURNING deliveries, processed_at IS NOT NULL"
)
_LOCK = text(
    "SELECT processed_at IS NOT NULL FROM processed_messages "
    "WHERE consumer = :consumer AND message_id = :id FOR UPDATE"
)
_MARK = (
    "UPDATE processed_messages SET processed_at = now(), outcome = %(outcome)s "
    "WHERE consumer = %(consumer)s AND message_id = %(id)s"
)


def deliver(
    engine: Engine,
    delivery: Delivery,
    *,
    max_deliveries: int,
    backoff_max: float = 60.0,
    handlers: Mapping[str, Handler] = HANDLERS,
) -> Outcome:
    """Process one delivery; ``RetryLater`` when it should come again."""
    deliveries, processed = _count(engine, delivery)
    if processed:
        return Outcome.DUPLICATE
    handler = handlers.get(delivery.topic)
    if handler is None:
        return _dead_letter(engine, delivery, deliveries, f"no consumer for {delivery.topic!r}")
    if deliveries > max_deliveries:
        return _dead_letter(engine, delivery, deliveries, "delivered too many times")
    try:
        outcome, after = _apply(engine, delivery, handler)
    except Exception as error:
        if deliveries >= max_deliveries:
            log.exception("dead-lettering %s after %d deliveries", delivery, deliveries)
            return _dead_letter(engine, delivery, deliveries, repr(error))
        raise RetryLater(min(2.0 ** (deliveries - 1), backoff_max), error) from error
    if after is not None:
        try:
            after()
        except Exception:  # a hint: the periodic paths make up for it
            log.warning("after-commit hint of %s failed", delivery, exc_info=True)
    return outcome


def _params(delivery: Delivery) -> dict[str, Any]:
    return {"consumer": delivery.topic, "id": delivery.message_id}


def _count(engine: Engine, delivery: Delivery) -> tuple[int, bool]:
    with engine.begin() as conn:
        deliveries, processed = conn.execute(_COUNT, _params(delivery)).one()
    return int(deliveries), bool(processed)


def _apply(
    engine: Engine, delivery: Delivery, handler: Handler
) -> tuple[Outcome, AfterCommit | None]:
    with SqlUnitOfWork(engine) as uow:
        # The row lock makes a concurrent duplicate delivery wait, then skip.
        if uow.connection.execute(_LOCK, _params(delivery)).scalar_one():
            return Outcome.DUPLICATE, None
        after = handler(uow, delivery)
        uow.events.defer(_MARK, [{**_params(delivery), "outcome": Outcome.DONE.value}])
        uow.commit()
    return Outcome.DONE, after


def _dead_letter(engine: Engine, delivery: Delivery, deliveries: int, error: str) -> Outcome:
    with SqlUnitOfWork(engine) as uow:
        if uow.connection.execute(_LOCK, _params(delivery)).scalar_one():
            return Outcome.DUPLICATE
        data = {
            "message_id": str(delivery.message_id),
            "topic": delivery.topic,
            "payload": dict(delivery.payload),
            "deliveries": deliveries,
            "error": error,
        }
        meta = EventMetadata(
            actor=ACTOR, occurred_at=datetime.now(UTC), causation_id=delivery.message_id
        )
        event_id = uuid5(delivery.message_id, f"deadletter:{delivery.topic}")
        uow.events.append(
            dead_letter_stream(delivery.topic),
            ANY_VERSION,
            [NewEvent(event_id, DEAD_LETTERED, data, meta)],
        )
        uow.events.defer(_MARK, [{**_params(delivery), "outcome": Outcome.DEAD.value}])
        uow.commit()
    log.error("dead-lettered %s after %d deliveries: %s", delivery, deliveries, error)
    return Outcome.DEAD


def dead_letter_stream(topic: str) -> str:
    return f"deadletter-{topic}"
