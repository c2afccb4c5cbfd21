"""The fallbacks a fresh machine relies on: embedded Postgres and Redis."""

from __future__ import annotations

import tempfile
from pathlib import Path

import redis
import sqlalchemy as sa

from service.runtime.embedded import embedded_postgres, embedded_redis, reachable


def test_embedded_postgres_starts_answers_and_stops() -> None:
    data = Path(tempfile.mkdtemp(prefix="qm-embedded-")) / "pgdata"
    with embedded_postgres(data, cleanup="delete") as url:
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT 40 + 2").scalar() == 42
        engine.dispose()
    assert not data.exists()


def test_embedded_redis_starts_answers_and_stops() -> None:
    with tempfile.TemporaryDirectory() as data, embedded_redis(Path(data)) as url:
        client = redis.Redis.from_url(url)
        client.set("k", "v")
        assert client.get("k") == b"v"
        port = client.connection_pool.connection_kwargs["port"]
        client.close()
    assert not reachable("127.0.0.1", port)


def test_redis_fixture_gives_a_working_server(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    assert client.ping() is True
    client.close()
