"""Tables the workers own: what each consumer processed, the scheduler's
leader epochs, and the admission fair-sharing history.

Alembic's ``0005_workers`` creates them; ``alembic check`` compares against this.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Double,
    Integer,
    MetaData,
    Table,
    Text,
    Uuid,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from service.eventstore.schema import NAMING

metadata = MetaData(naming_convention=NAMING)

# One row per (consumer, outbox message) ever delivered. ``deliveries`` is
# bumped in a transaction of its own before the effect runs, so that a
# delivery that crashes the worker still counts towards the dead-letter
# bound; ``processed_at`` is set in the *same* transaction as the effect,
# which is what makes a redelivered message a no-op.
processed_messages = Table(
    "processed_messages",
    metadata,
    Column("consumer", Text, primary_key=True),
    Column("message_id", Uuid, primary_key=True),
    Column("deliveries", Integer, nullable=False),
    Column(
        "first_delivered_at", DateTime(timezone=True), nullable=False, server_default=func.now()
    ),
    Column("processed_at", DateTime(timezone=True), nullable=True),
    Column("outcome", Text, nullable=True),
)

# The fencing token of each singleton role (``admission``): bumped by every
# new leader. A leader's commit locks the row and checks the epoch it was
# given, so a deposed leader (its advisory lock lost with its session) can
# never commit after its successor started.
leader_epochs = Table(
    "leader_epochs",
    metadata,
    Column("role", Text, primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    Column("holder", Text, nullable=False),
    Column("acquired_at", DateTime(timezone=True), nullable=False),
)

# Decayed historical usage per LocalQueue (admission fair sharing, KEP-4136),
# derived state that a new leader resumes from; losing it only forgets history.
admission_usage = Table(
    "admission_usage",
    metadata,
    Column("local_queue", Text, primary_key=True),
    Column("consumed", JSONB, nullable=False),
    Column("last_update", Double, nullable=False),
)
