"""Celery tasks: thin. Every outbox message is one ``deliver`` task whose id
is the message id; the consumers (workers/consumers.py) make it exactly-once."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import cache
from typing import Any
from uuid import UUID

import psycopg
import redis
from celery import Celery, Task
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from service.app.bootstrap import make_engine
from service.app.uow import SqlUnitOfWork
from workers.celery_app import app
from workers.clusters import MemberError
from workers.coalesce import Coalescer
from workers.consumers import Delivery, Outcome, RetryLater, consumer, deliver
from workers.fleet import Connector, reconcile_once
from workers.jsonio import postgres_json
from workers.outbox import Send
from workers.reconcile import TOPIC as RECONCILE_TOPIC
from workers.records import WAKE_TOPIC
from workers.settings import get_worker_settings

log = logging.getLogger(__name__)

DELIVER = "quartermaster.deliver"
WAKE_CHANNEL = "qm:admission:wake"


def wake_channel(broker_url: str) -> str:
    """The admission leader's wake-up channel on this broker. Pub/sub channels
    are server-wide (a Redis database number does not separate them), so the
    number is part of the name: deployments or test processes sharing a Redis
    server on different databases do not wake each other's leader."""
    db = redis.connection.parse_url(broker_url).get("db", 0)  # type: ignore[no-untyped-call]
    return f"{WAKE_CHANNEL}:{db}"


@cache
def _engine(pid: int) -> Engine:
    """One pool per process, made after the fork (keyed by pid)."""
    url = get_worker_settings().database_url
    if not url:
        raise RuntimeError("QM_DATABASE_URL is not set")
    postgres_json()
    return make_engine(url, pool_size=3)  # the message, a pass, its reads, the pass lock


@cache
def _redis(pid: int) -> redis.Redis:
    return redis.Redis.from_url(get_worker_settings().broker_url)


def engine() -> Engine:
    return _engine(os.getpid())


@app.task(name=DELIVER, bind=True, max_retries=None)  # type: ignore[untyped-decorator]
def deliver_task(self: Task, topic: str, payload: Mapping[str, Any]) -> str:
    settings = get_worker_settings()
    delivery = Delivery(UUID(str(self.request.id)), topic, payload)
    try:
        outcome: Outcome = deliver(
            engine(),
            delivery,
            max_deliveries=settings.max_deliveries,
            backoff_max=settings.retry_backoff_max,
        )
    except RetryLater as later:
        raise self.retry(exc=later.cause, countdown=later.countdown) from later.cause
    except (DBAPIError, psycopg.Error) as error:
        # The database is unreachable (restart, failover): not the message's
        # fault, so it is not counted towards the dead-letter bound. Without
        # this the failure would be acknowledged and the message left to the
        # relay's republish sweep.
        countdown = min(1.0 + self.request.retries, settings.retry_backoff_max)
        raise self.retry(exc=error, countdown=countdown) from error
    return outcome.value


def sender(celery: Celery = app) -> Send:
    """The relay's sender: one ``deliver`` task per outbox message, its id
    the message's id."""

    def send(message_id: UUID, topic: str, payload: Mapping[str, Any]) -> None:
        celery.send_task(DELIVER, args=(topic, dict(payload)), task_id=str(message_id))

    return send


@consumer(WAKE_TOPIC)
def wake_admission(uow: SqlUnitOfWork, delivery: Delivery) -> Any:
    """Something changed that the admission cycle should see: nudge the
    leader now rather than at its next tick."""
    client = _redis(os.getpid())
    channel = wake_channel(get_worker_settings().broker_url)
    return lambda: client.publish(channel, str(delivery.message_id))


@cache
def _connector(pid: int) -> Connector:
    return Connector(get_worker_settings())


@cache
def _coalescer(pid: int) -> Coalescer:
    settings = get_worker_settings()
    return Coalescer(engine(), settings.broker_url, settings.reconcile_spacing)


@consumer(RECONCILE_TOPIC)
def reconcile_cluster(uow: SqlUnitOfWork, delivery: Delivery) -> Any:
    """The admission cycle decided something for this cluster: carry it out
    now, unless a pass of it is running elsewhere (which then runs one more:
    workers/coalesce.py). Each pass commits its records on its own; an
    unreachable cluster is left to the fleet loop (sync marks it Lost past
    its lease)."""
    settings = get_worker_settings()
    settings = settings.model_copy(
        update={"delete_wait": min(settings.delete_wait, settings.task_time_limit / 2)}
    )
    cluster = str(delivery.payload["cluster"])

    def one_pass() -> None:
        try:
            reconcile_once(
                engine(),
                cluster,
                _connector(os.getpid()),
                settings,
                lambda: datetime.now(UTC),
                strays=False,  # the fleet loop's passes collect those
            )
        except MemberError as error:
            log.warning("reconcile of %s left to the next resync: %s", cluster, error)

    # Bounded: the rest is the next delivery's (there is one while admissions
    # go on) or the fleet loop's next resync.
    _coalescer(os.getpid()).run(cluster, one_pass, budget=max(1.0, 4 * settings.reconcile_spacing))
    return None
