"""The Celery app: at-least-once delivery, made exactly-once in effect by the
consumers (workers/consumers.py).

* ``acks_late``: a message is acknowledged after its task returns, so a
  worker that dies mid-task leaves it to be delivered again;
* ``reject_on_worker_lost``: a pool process killed mid-task (OOM, ``kill -9``)
  requeues its message at once instead of acknowledging it as failed;
* prefetch 1: a worker holds no more unacknowledged messages than it runs;
* Redis' ``visibility_timeout`` (when an unacknowledged message is handed to
  another worker) is longer than the hard time limit of any task and than any
  retry countdown, so a live task is never delivered twice for that reason;
* a lost broker connection cancels running tasks, whose messages Redis will
  redeliver anyway (celery#7515 otherwise runs them twice).

Redeliveries are bounded by ``QM_MAX_DELIVERIES``, counted in Postgres; the
last one ends in a dead-letter event (workers/consumers.py).
"""

from __future__ import annotations

from celery import Celery

from workers.broker import TRANSPORT
from workers.settings import WorkerSettings, get_worker_settings

QUEUE = "quartermaster"


def make_celery(settings: WorkerSettings) -> Celery:
    if settings.retry_backoff_max >= settings.visibility_timeout:
        raise ValueError("QM_RETRY_BACKOFF_MAX must be shorter than QM_VISIBILITY_TIMEOUT")
    if settings.task_time_limit >= settings.visibility_timeout:
        raise ValueError("QM_TASK_TIME_LIMIT must be shorter than QM_VISIBILITY_TIMEOUT")
    app = Celery("quartermaster", broker=settings.broker_url, include=["workers.tasks"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # A failed task is acknowledged: the consumer has already scheduled its
        # retry or dead-lettered it, and a redelivery would only repeat that.
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        # kombu's Redis transport, but an acknowledgement through a connection a
        # Redis restart reset no longer kills the worker (workers/broker.py).
        broker_transport=TRANSPORT,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout},
        broker_connection_retry_on_startup=True,
        task_time_limit=settings.task_time_limit,
        task_soft_time_limit=settings.task_time_limit * 0.9,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=QUEUE,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app


app = make_celery(get_worker_settings())
