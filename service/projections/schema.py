"""Tables of the projections: the tracking table and the read models."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, Index, Integer, MetaData, Table, Text

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

stream_index = Table(
    "stream_index",
    metadata,
    Column("stream", Text, primary_key=True),
    Column("category", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("last_type", Text, nullable=False),
    Column("last_position", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_stream_index_category_stream", "category", "stream"),
)
