"""Tables of the projections: the tracking table and the read models."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    Uuid,
    desc,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from service.eventstore.schema import NAMING

metadata = MetaData(naming_convention=NAMING)

# (name, position): the last event a projection applied. Updated in the same
# transaction as its read model, which is what makes a projection exactly-once.
projection_tracking = Table(
    "projection_tracking",
    metadata,
    Column("name", Text, primary_key=True),
    Column("position", BigInteger, nullable=False),
)

# The API's objects, one row per (kind, namespace, name). Kept *inline*: the
# command handler writes the row in the same transaction as the event that
# changes it, so a client reads its own writes; ``projections rebuild
# resources`` replays the same function over the log. Deleted objects stay as
# tombstones so that a re-created object continues its stream's versions.
resources = Table(
    "resources",
    metadata,
    Column("kind", Text, primary_key=True),
    Column("namespace", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("uid", Uuid, nullable=False),
    Column("resource_version", BigInteger, nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("labels", JSONB, nullable=False),
    Column("annotations", JSONB, nullable=False),
    Column("spec", JSONB, nullable=False),
    Column("status", JSONB, nullable=False),
    Column("secret", LargeBinary, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("deleted", Boolean, nullable=False),
    Index("ix_resources_workload_queue", "kind", "namespace", text("(spec->>'queueName')")),
    Index(
        "ix_resources_workload_admission_cluster",
        "kind",
        text("((status -> 'admission'::text) ->> 'cluster'::text)"),
    ),
    Index(
        "ix_resources_workload_eviction_cluster",
        "kind",
        text("((status -> 'eviction'::text) ->> 'cluster'::text)"),
    ),
    # The workloads list by state or priority class, in its keyset order (0010).
    Index(
        "ix_resources_workload_state",
        "kind",
        text("(status ->> 'state'::text)"),
        "namespace",
        "name",
    ),
    Index(
        "ix_resources_workload_priority_class",
        "kind",
        text("(spec ->> 'priorityClassName'::text)"),
        "namespace",
        "name",
    ),
    # A ClusterQueue's queue in explain's order: priority, then age (0011).
    Index(
        "ix_resources_workload_queue_order",
        "kind",
        text("(status ->> 'clusterQueue'::text)"),
        text("(status ->> 'state'::text)"),
        # A DESC expression: SQLAlchemy's stubs type Index's arguments as columns only.
        desc(text("COALESCE((spec ->> 'priority'::text)::bigint, 0::bigint)")),  # type: ignore[arg-type]
        "created_at",
        "namespace",
        "name",
    ),
)

# Bearer tokens, stored as SHA-256 of the secret (tokens are 256-bit random,
# so a slow hash buys nothing). Maintained inline from TokenIssued/TokenRevoked.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("name", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("namespaces", JSONB, nullable=False),
    Column("token_hash", LargeBinary, nullable=False, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("revoked", Boolean, nullable=False),
    # Null for tokens issued before expiry existed (migration 0008).
    Column("expires_at", DateTime(timezone=True)),
    # Issuing looks a name up: names are never reused.
    Index("ix_api_tokens_name", "name"),
)

# Idempotency-Key records (not events: they are a cache of responses that
# expires after ``idempotency_ttl``), scoped per principal.
idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("principal", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("request_hash", LargeBinary, nullable=False),
    Column("status_code", Integer, nullable=True),
    Column("headers", JSONB, nullable=True),
    Column("body", LargeBinary, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ix_idempotency_keys_created_at", "created_at"),
)
