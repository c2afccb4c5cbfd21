from __future__ import annotations

import pytest
import sqlalchemy as sa

from service.eventstore.postgres import PostgresEventStore
from tests.eventstore.contract import EventStoreContract, new


class TestPostgresEventStore(EventStoreContract):
    @pytest.fixture
    def store(self, engine: sa.Engine) -> PostgresEventStore:
        return PostgresEventStore(engine)


# The COPY and INSERT paths encode with orjson and fall back to the standard
# encoder where the two differ; the stored JSON must be what json.dumps makes.


@pytest.mark.parametrize("size", [1, 40])
def test_non_finite_numbers_are_refused_and_nothing_is_stored(engine: sa.Engine, size: int) -> None:
    store = PostgresEventStore(engine)
    for bad in (float("nan"), float("inf"), -float("inf")):
        batch = [new(i=i) for i in range(size - 1)] + [new(value=bad, other=None)]
        with pytest.raises(ValueError, match="not JSON compliant"):
            store.append("nan-1", 0, batch)
    assert store.head_position() == 0


@pytest.mark.parametrize("size", [1, 40])
def test_values_orjson_would_change_are_stored_as_json_dumps_stores_them(
    engine: sa.Engine, size: int
) -> None:
    store = PostgresEventStore(engine)
    data = {"count": {1: "int key"}, "huge": 2**70, "none": None, "tiny": 1e-300}
    store.append("odd-1", 0, [new(i=i, **data) for i in range(size)])
    stored = [e.data for e in store.read_stream("odd-1")]
    assert stored == [{"i": i, **data, "count": {"1": "int key"}} for i in range(size)]
