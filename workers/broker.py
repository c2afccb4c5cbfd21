"""The Redis transport of kombu, with one of its failures made survivable.

When Redis restarts, kombu reconnects the worker's consumer, but a channel
of the old connection may still be used: a task that ends meanwhile
acknowledges through it, and closing it restores its unacknowledged
messages through it. Building a Redis client for a channel whose connection
is gone fails with ``AttributeError: 'NoneType' object has no attribute
'hostname'`` (the kombu#582 family), which neither
``Message.ack_log_error`` nor the consumer's reconnect expects: the worker
exits. Here that failure is the connection error it is, which kombu logs
(or ignores, closing) and survives. What is lost with it is harmless: the
restarted Redis no longer holds those messages, and every task's effect is
idempotent (workers/consumers.py).

Celery uses it through ``broker_transport`` (workers/celery_app.py).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis


class Channel(redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        if getattr(self.connection, "client", None) is None:
            raise ConnectionError(
                "the broker connection was reset (Redis restarted): nothing to reconnect with"
            )
        return super()._connparams(asynchronous)  # type: ignore[no-untyped-call]


class Transport(redis.Transport):
    Channel = Channel


#: ``broker_transport`` for Celery: this module's transport.
TRANSPORT = f"{__name__}:Transport"
