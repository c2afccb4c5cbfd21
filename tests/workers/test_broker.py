"""An acknowledgement through a connection a Redis restart reset is a
connection error kombu logs, not an AttributeError that kills the worker."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kombu import Connection, Exchange, Queue

from workers.broker import TRANSPORT
from workers.celery_app import make_celery
from workers.settings import WorkerSettings


@contextmanager
def _reset_mid_reconnect(transport: str | None, broker: str) -> Iterator[tuple[Connection, Any]]:
    """A message delivered to a consumer, then the state a reconnect leaves
    its channel in: no connection parameters to build a client from."""
    conn = Connection(broker, transport=transport)
    queue = Queue("qm-test-broker", Exchange("qm-test-broker"), "k")
    with conn.Producer() as producer:
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key="k", declare=[queue])
    channel = conn.channel()
    message = queue(channel).get(no_ack=False)
    assert message is not None
    channel._pool = None  # what kombu drops when the connection goes
    channel.connection.client = None
    try:
        yield conn, message
    finally:
        channel.connection.client = conn
        conn.release()


def test_the_stock_transport_would_crash_the_worker(broker: str) -> None:
    with _reset_mid_reconnect(None, broker) as (conn, message), pytest.raises(AttributeError):
        message.ack_log_error(logging.getLogger("test"), conn.connection_errors)


def test_ours_logs_the_lost_acknowledgement_and_goes_on(
    broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    with _reset_mid_reconnect(TRANSPORT, broker) as (conn, message):
        message.ack_log_error(logging.getLogger("test"), conn.connection_errors)
    assert "Couldn't ack" in caplog.text and "connection was reset" in caplog.text


def test_closing_a_reset_channel_is_a_connection_error(broker: str) -> None:
    """Closing restores unacknowledged messages through the channel; kombu
    ignores connection errors there (an AttributeError ended the worker)."""
    with _reset_mid_reconnect(TRANSPORT, broker) as (conn, message):
        with pytest.raises(ConnectionError):
            message.channel.qos.restore_unacked()
        assert isinstance(ConnectionError(), conn.connection_errors)


def test_celery_uses_it(broker: str) -> None:
    app = make_celery(WorkerSettings(broker_url=broker))
    with app.connection_for_read() as conn:
        assert conn.transport_cls == TRANSPORT
        assert type(conn.transport).__module__ == "workers.broker"
