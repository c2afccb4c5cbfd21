"""The service's handlers over this test's emptied database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from service.app.bootstrap import Services, bootstrap
from service.config import Settings


@pytest.fixture
def services(engine: sa.Engine, database_url: str) -> Iterator[Services]:
    built = bootstrap(Settings(database_url=database_url, db_pool_size=4))
    yield built
    built.close()
