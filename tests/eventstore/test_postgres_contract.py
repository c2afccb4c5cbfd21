from __future__ import annotations

import pytest
import sqlalchemy as sa

from service.eventstore.postgres import PostgresEventStore
from tests.eventstore.contract import EventStoreContract


class TestPostgresEventStore(EventStoreContract):
    @pytest.fixture
    def store(self, engine: sa.Engine) -> PostgresEventStore:
        return PostgresEventStore(engine)
