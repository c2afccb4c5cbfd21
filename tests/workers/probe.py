"""A test consumer, loaded into worker processes with ``--include``.

Topic ``test.probe`` appends one event (random id, so not idempotent by
itself) to ``probe-<message id>``: how many events that stream holds is how
many times the effect happened. The payload can ask it to fail, or to stall
(writing its pid to a file first, once) before or after its commit, so that
a test can kill the pool process there.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

from service.app.uow import SqlUnitOfWork
from service.domain.events import declare
from service.eventstore.port import ANY_VERSION, EventMetadata, NewEvent
from workers.consumers import Delivery, consumer

TOPIC = "test.probe"
PROBED = declare("Probed", frozenset({"probe"}), frozenset(), "the test consumer's effect")


def _stall_once(path: str) -> None:
    marker = Path(path)
    if marker.exists():
        return
    marker.write_text(str(os.getpid()))
    time.sleep(60)


@consumer(TOPIC)
def probe(uow: SqlUnitOfWork, delivery: Delivery) -> Any:
    payload = delivery.payload
    if payload.get("fail"):
        raise RuntimeError("probe asked to fail")
    meta = EventMetadata(actor="test:probe", occurred_at=datetime.now(UTC))
    uow.events.append(
        f"probe-{delivery.message_id}",
        ANY_VERSION,
        [NewEvent(uuid4(), PROBED, {"pid": os.getpid()}, meta)],
    )
    if payload.get("stall_before_commit"):
        _stall_once(payload["stall_before_commit"])
    if payload.get("stall_after_commit"):
        path = payload["stall_after_commit"]
        return lambda: _stall_once(path)
    return None
