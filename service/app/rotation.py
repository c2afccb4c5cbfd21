"""Re-encrypting every stored member-cluster credential under the current
``QM_SECRET_KEY`` (``quartermaster secrets rotate``), without downtime.

A Cluster's credentials live sealed in its read-model row and in every event
of its stream (each carries the whole state: service/projections/resources.py).
So a rotation is one more event per Cluster, ``ClusterCredentialsRotated``,
with the state as it is and the credentials sealed again, appended at the
version read and applied to the row in the same transaction — the write path
of every other change. Events after it carry the new ciphertext (a writer that
read the row before it fails its commit on the version and reads again), a
rebuild of the read model ends at it, and older events keep the old
ciphertext: once the previous key is dropped they cannot be opened, and
nothing needs them to be.

Deleted Clusters whose collection has not ended keep their credentials (the
sweep uses them) and are rotated too; a credential no key of this process
opens is reported, never overwritten.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from sqlalchemy import Engine, select
from sqlalchemy.engine import Row

from service.app.crypto import SecretBox
from service.app.resources import stream_name
from service.app.uow import SqlUnitOfWork
from service.domain.events import CLUSTER_CREDENTIALS_ROTATED
from service.eventstore.port import ConcurrencyConflict, EventMetadata, NewEvent
from service.projections.resources import defer_resources, resource_row
from service.projections.schema import resources

log = logging.getLogger(__name__)

ACTOR = "system:secrets-rotate"
#: Attempts at one Cluster whose stream moved under us (a heartbeat, say).
ATTEMPTS = 20


@dataclass
class RotationReport:
    """What a rotation did, Cluster by Cluster."""

    key_id: str
    rotated: list[str] = field(default_factory=list)
    #: Already sealed under the current key.
    current: list[str] = field(default_factory=list)
    #: Cluster -> why its credentials were left as they are.
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed


def _sealed_clusters(engine: Engine) -> list[str]:
    query = (
        select(resources.c.name)
        .where(resources.c.kind == "Cluster", resources.c.secret.is_not(None))
        .order_by(resources.c.name)
    )
    with engine.connect() as conn:
        return [str(name) for name in conn.execute(query).scalars()]


def _state(row: Row[Any], secret: bytes) -> dict[str, Any]:
    """The Cluster's state as it is, with ``secret`` for its credentials."""
    return {
        "kind": row.kind,
        "namespace": row.namespace,
        "name": row.name,
        "uid": str(row.uid),
        "generation": row.generation,
        "labels": dict(row.labels),
        "annotations": dict(row.annotations),
        "spec": dict(row.spec),
        "status": dict(row.status),
        "secret": base64.b64encode(secret).decode(),
        "created_at": row.created_at.isoformat(),
        "deleted": bool(row.deleted),
    }


def _rotate_one(uow: SqlUnitOfWork, box: SecretBox, name: str, now: datetime) -> str:
    """``rotated``, ``current`` or ``gone``; raises ValueError when no key opens it.

    Optimistic, as the workers' writes are: the row is read without a lock,
    the event appended at the version read (a writer that appended since
    fails this commit: ConcurrencyConflict) and the row written in the
    commit pipeline after the sequencer, in the order the workers take them
    (a row lock taken first would wait on a heartbeat that waits on us)."""
    query = select(resources).where(
        resources.c.kind == "Cluster", resources.c.namespace == "", resources.c.name == name
    )
    row = uow.connection.execute(query).first()
    if row is None or row.secret is None:
        return "gone"  # collected meanwhile: its credentials were dropped
    sealed = bytes(row.secret)
    if box.is_current(sealed):
        return "current"
    data = _state(row, box.reseal(sealed))
    version = int(row.resource_version)
    meta = EventMetadata(actor=ACTOR, occurred_at=now)
    stream = stream_name("Cluster", "", name)
    uow.events.append(stream, version, [NewEvent(uuid4(), CLUSTER_CREDENTIALS_ROTATED, data, meta)])
    defer_resources(uow.events.defer, [resource_row(data, version + 1, now)])
    uow.commit()
    return "rotated"


def rotate_credentials(
    engine: Engine,
    unit_of_work: Callable[[], SqlUnitOfWork],
    box: SecretBox,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> RotationReport:
    """Seal every stored credential under ``box``'s key, one transaction
    per Cluster; running it again changes nothing."""
    report = RotationReport(box.key_id)
    for name in _sealed_clusters(engine):
        for attempt in range(1, ATTEMPTS + 1):
            try:
                with unit_of_work() as uow:
                    outcome = _rotate_one(uow, box, name, clock())
            except ConcurrencyConflict:
                # Appended to between our read and our commit: read again.
                if attempt == ATTEMPTS:
                    report.failed[name] = f"its stream kept changing ({ATTEMPTS} attempts)"
                continue
            except ValueError as error:
                report.failed[name] = str(error)
                break
            if outcome == "rotated":
                report.rotated.append(name)
            elif outcome == "current":
                report.current.append(name)
            break
    log.info(
        "credentials rotated to key %s: %d re-sealed, %d already current, %d failed",
        report.key_id,
        len(report.rotated),
        len(report.current),
        len(report.failed),
    )
    return report


__all__ = ["ACTOR", "RotationReport", "rotate_credentials"]
