"""``projections rebuild`` of a deleted Cluster: the read model the rebuild
makes is the one the fleet loop left live, whichever way its collection
went (the collection's events were once missing from the projection, so a
rebuild brought the Cluster back as it was before, credentials included)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from service.app.auth import Principal, Role
from service.app.bootstrap import Services
from service.app.resources import Actor
from tests.foundation.rebuild import EmptyMember, differences, read_models, rebuild_all
from workers.clusters import MemberError
from workers.collect import CollectPolicy, collect
from workers.records import ClusterRow, clusters

ADMIN = Actor(Principal("test-admin", frozenset({Role.ADMIN}), frozenset({"*"})))
CLUSTER = {
    "metadata": {"name": "c1"},
    "spec": {"server": "https://c1.example:6443", "credentials": {"token": "secret-t"}},
}


def _cluster(engine: sa.Engine) -> ClusterRow:
    with engine.connect() as conn:
        (row,) = clusters(conn, "c1")
    return row


def _unreachable(row: ClusterRow) -> Any:
    raise MemberError(f"{row.name}: unreachable")


@pytest.mark.parametrize(
    ("connect", "deadline", "state", "secret_kept"),
    [
        (lambda _: EmptyMember(), 3600.0, "Collected", False),
        (_unreachable, 3600.0, "Collecting", True),
        (_unreachable, 0.0, "Failed", False),
    ],
    ids=["collected", "collecting", "failed"],
)
def test_a_deleted_cluster_rebuilds_as_its_collection_left_it(
    engine: sa.Engine,
    services: Services,
    connect: Any,
    deadline: float,
    state: str,
    secret_kept: bool,
) -> None:
    services.resources.create(ADMIN, "clusters", "", CLUSTER)
    services.resources.delete(ADMIN, "clusters", "", "c1", None)
    policy = CollectPolicy(first_backoff=1.0, max_backoff=1.0, deadline=deadline)
    report = collect(
        engine, services.unit_of_work, _cluster(engine), connect, policy, datetime.now(UTC)
    )
    assert report.state == state and not report.conflicted
    live = read_models(engine)

    rebuild_all(engine)

    assert differences(live, read_models(engine)) == []
    row = _cluster(engine)
    assert row.deleted and row.status["collection"]["state"] == state
    assert (row.secret is not None) == secret_kept
