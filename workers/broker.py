"""The Redis transport of kombu, with one of its failures made survivable.

When Redis restarts, kombu reconnects the worker's consumer, but a task that
ends meanwhile acknowledges through a channel whose connection is gone:
building the Redis client then fails with ``AttributeError: 'NoneType'
object has no attribute 'hostname'`` (the kombu#582 family), which
``Message.ack_log_error`` does not expect, and the worker exits. Here that
failure is the connection error it is, which kombu logs and survives. Losing
the acknowledgement is harmless: the restarted Redis no longer holds the
message, and every task's effect is idempotent (workers/consumers.py).

Celery uses it through ``broker_transport`` (workers/celery_app.py).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis


class QoS(redis.QoS):
    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        try:
            return super()._remove_from_indices(delivery_tag, pipe)  # type: ignore[no-untyped-call]
        except AttributeError as error:
            raise ConnectionError(
                f"cannot acknowledge {delivery_tag}: the broker connection was reset"
            ) from error


class Channel(redis.Channel):
    QoS = QoS


class Transport(redis.Transport):
    Channel = Channel


#: ``broker_transport`` for Celery: this module's transport.
TRANSPORT = f"{__name__}:Transport"
