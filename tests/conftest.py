"""Shared fixtures: real Postgres and Redis (see tests/harness.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import sqlalchemy as sa

from service.app.bootstrap import make_engine
from service.app.migrate import upgrade
from tests.harness import (
    postgres_server,
    redis_database,
    redis_server,
    reset_database,
    scratch_database,
)
from tests.ordering import LONG, spread


@pytest.hookimpl(trylast=True)  # after ``-m`` has deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the long modules first in every process's share
    (tests/ordering.py, cut as ``--dist worksteal`` cuts them); each test
    process orders its collection alike. xdist sets a worker's ``dist`` option
    to "no", so a worker is known by its ``workerinput``."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1 and hasattr(config, "workerinput"):
        keys = [
            item.nodeid if item.nodeid in LONG else item.nodeid.split("::")[0] for item in items
        ]
        items[:] = spread(items, keys, workers)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    with ExitStack() as stack, postgres_server(stack) as url:
        yield url


@pytest.fixture(scope="session")
def empty_database_url(postgres_server_url: str) -> Iterator[str]:
    """A fresh, unmigrated database for this test process."""
    with scratch_database(postgres_server_url) as url:
        yield url


@pytest.fixture(scope="session")
def database_url(empty_database_url: str) -> str:
    upgrade(empty_database_url)
    return empty_database_url


@pytest.fixture(scope="session")
def _session_engine(database_url: str) -> Iterator[sa.Engine]:
    engine = make_engine(database_url, pool_size=20)
    yield engine
    engine.dispose()


@pytest.fixture
def engine(_session_engine: sa.Engine) -> sa.Engine:
    """An engine on a migrated database emptied before this test."""
    reset_database(_session_engine)
    return _session_engine


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with ExitStack() as stack, redis_server(stack) as url, redis_database(url) as own:
        yield own
