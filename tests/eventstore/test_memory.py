from __future__ import annotations

import pytest

from service.eventstore.memory import InMemoryEventStore
from tests.eventstore.contract import EventStoreContract


class TestInMemoryEventStore(EventStoreContract):
    @pytest.fixture
    def store(self) -> InMemoryEventStore:
        return InMemoryEventStore()
