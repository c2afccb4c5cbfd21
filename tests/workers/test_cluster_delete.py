"""A deleted member Cluster: the API refuses while gangs are admitted there
and never waits for the member; the fleet loop then removes what we wrote
there with the credentials the deleted row kept, retries while it cannot,
records how it ended, and requeues the gangs still tied to the cluster."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import kubernetes
import pytest
import sqlalchemy as sa
import yaml

from service.app.admission import AdmissionCycle
from service.app.bootstrap import Services
from service.app.crypto import SecretBox
from service.app.errors import BeingDeleted, InUse
from service.app.uow import SqlUnitOfWork
from sim.kubesim.testing import RunningCluster
from tests.workers.conftest import ADMIN, wait_for, workload_status
from tests.workers.members import (
    cluster_body,
    gang,
    job,
    ledger,
    members,
    scheduling,
    settings,
    setup_central,
)
from workers.clusters import MemberError
from workers.collect import CollectPolicy, collect, due, waiting
from workers.fleet import Connector, reconcile_once, sync_once
from workers.outbox import Send
from workers.plan import CLUSTER_UID_LABEL
from workers.records import ClusterRow, clusters

KUEUE = "kueue.x-k8s.io/v1beta2"
SWEPT = [("batch/v1", "Job")] + [
    (KUEUE, k) for k in ("LocalQueue", "ClusterQueue", "ResourceFlavor", "WorkloadPriorityClass")
]


def _row(engine: sa.Engine, name: str = "c1") -> Any:
    with engine.connect() as conn:
        (row,) = [r for r in clusters(conn) if r.name == name]
    return row


def _collection(engine: sa.Engine) -> dict[str, Any]:
    return dict(_row(engine).status.get("collection") or {})


def _ours_on(cluster: RunningCluster) -> list[str]:
    """Every object on the stand-in that carries our managed label."""

    def read() -> list[str]:
        found = []
        for api_version, kind in [*SWEPT, ("v1", "Namespace")]:
            rtype = cluster.cluster.core.for_kind(api_version, kind).rtype
            for obj in cluster.cluster.store.items(rtype):
                if (obj["metadata"].get("labels") or {}).get("quartermaster.dev/managed"):
                    found.append(f"{kind} {obj['metadata']['name']}")
        return sorted(found)

    return cluster.run(read)


def _everything_recorded(engine: sa.Engine) -> str:
    """Every event, outbox message and ledger entry, as text."""
    with engine.connect() as conn:
        parts = [
            str(
                conn.exec_driver_sql(
                    f"SELECT coalesce(jsonb_agg({column})::text, '') FROM {table}"
                ).scalar()
            )
            for table, column in (
                ("events", "data"),
                ("outbox", "payload"),
                ("ledger_entries", "body"),
            )
        ]
    return "\n".join(parts)


def _flavor(cluster: RunningCluster, name: str, labels: dict[str, str]) -> None:
    body = {
        "apiVersion": KUEUE,
        "kind": "ResourceFlavor",
        "metadata": {"name": name, "labels": labels},
    }
    with cluster.api_client() as api:
        kubernetes.client.CustomObjectsApi(api).create_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "resourceflavors", body
        )


def test_a_deleted_lost_cluster_is_collected_once_it_answers(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    send: Send,
    tmp_path: Path,
) -> None:
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=16)
        config = settings(database_url, broker, cluster_lease=2.0, heartbeat_interval=0.5)
        with scheduling(engine, config, send):
            services.submissions.submit(ADMIN, "team-a", gang("a", duration="100000s"))
            wait_for(lambda: workload_status(engine, "team-a", "a")["state"] == "Running", 60)
            with pytest.raises(InUse, match="Workload/team-a/a"):
                services.resources.delete(ADMIN, "clusters", "", "c1", None)
            uid = _row(engine).uid
            # Objects another registration of this member wrote, and one of
            # ours from before the uid label.
            _flavor(c1, "qm-theirs", {"quartermaster.dev/managed": "true", CLUSTER_UID_LABEL: "x"})
            _flavor(c1, "qm-legacy", {"quartermaster.dev/managed": "true"})
            c1.partition()
            wait_for(lambda: _row(engine).state == "Lost", 60)
            assert workload_status(engine, "team-a", "a")["state"] == "Pending"  # requeued whole
            started = time.monotonic()
            services.resources.delete(ADMIN, "clusters", "", "c1", None)
            assert time.monotonic() - started < 2.0  # the member is not asked
            wait_for(lambda: _collection(engine).get("attempts", 0) >= 2, 60)
            trying = _collection(engine)
            assert trying["state"] == "Collecting" and "c1" in trying["lastError"]
            assert job(c1, "a") is not None  # still there: unreachable
            # The name stays taken while the sweep goes on (a new
            # registration would leave it nothing to work from).
            body = cluster_body(c1)
            with pytest.raises(BeingDeleted, match="being deleted") as refused:
                services.resources.create(ADMIN, "clusters", "", body)
            assert refused.value.errors == [("metadata.name", "Cluster c1 is being deleted")]
            assert _row(engine).deleted and _collection(engine)["state"] == "Collecting"
            c1.heal()
            wait_for(lambda: _collection(engine).get("state") == "Collected", 60)
        left = _ours_on(c1)
    done = _collection(engine)
    assert done["removed"] >= 6 and done["left"] == [] and done["attempts"] >= 3
    assert left == ["Namespace team-a", "ResourceFlavor qm-theirs"], left
    row = _row(engine)
    assert row.deleted and row.secret is None and row.uid == uid
    assert c1.token not in _everything_recorded(engine)
    with engine.connect() as conn:
        kinds = (
            conn.exec_driver_sql(
                "SELECT type FROM events WHERE stream = 'cluster-c1' ORDER BY position"
            )
            .scalars()
            .all()
        )
    assert "ResourceDeleted" in kinds and kinds[-1] == "ClusterCollected"
    assert set(kinds[kinds.index("ResourceDeleted") + 1 : -1]) == {"ClusterCollecting"}
    assert workload_status(engine, "team-a", "a")["state"] == "Pending"  # never ran twice
    # Collected: the name is free for a new registration.
    services.resources.create(ADMIN, "clusters", "", body)
    again = _row(engine)
    assert not again.deleted and again.uid != uid


def test_a_collection_that_cannot_reach_its_cluster_gives_up_and_requeues_its_gangs(
    engine: sa.Engine,
    services: Services,
    database_url: str,
    broker: str,
    tmp_path: Path,
) -> None:
    """Two gangs outlive the delete: ``ev``, evicted by the member while its
    job is still there, and ``race``, admitted by a cycle that read the
    fleet before the delete committed. Neither may wait forever."""
    config = settings(database_url, broker)
    t0 = datetime.now(UTC).replace(microsecond=900_000)  # whole seconds would hide rounding
    now = lambda: t0  # noqa: E731
    uow = lambda: SqlUnitOfWork(engine)  # noqa: E731
    with members(tmp_path) as (c1,):
        setup_central(services, [c1], gpu_quota=32)
        connect = Connector(config)
        try:
            assert sync_once(engine, "c1", connect, config, now).heartbeat
            cycle = AdmissionCycle(engine, services.unit_of_work)
            services.submissions.submit(ADMIN, "team-a", gang("ev", duration="100000s"))
            cycle.run(lambda uow: None)
            assert reconcile_once(engine, "c1", connect, config, now).dispatched
            member = wait_for(lambda: _member_workload(c1), 60)
            _deactivate(c1, member)
            wait_for(lambda: _evicted(engine, "c1", connect, config, now), 60)
            assert job(c1, "ev") is not None
            services.submissions.submit(ADMIN, "team-a", gang("race", duration="100000s"))
            # The delete commits between the cycle's read and its commit.
            cycle.run(lambda uow: services.resources.delete(ADMIN, "clusters", "", "c1", None))
            assert workload_status(engine, "team-a", "race")["admission"]["cluster"] == "c1"
            c1.partition()
            policy = CollectPolicy(first_backoff=1.0, max_backoff=4.0, deadline=10.0)
            first = collect(engine, uow, _row(engine), connect, policy, t0)
            assert first.state == "Collecting" and first.error and not first.requeued
            row = _row(engine)
            assert not due(row, t0 + timedelta(seconds=0.5)) and due(row, t0 + timedelta(seconds=1))
            second = collect(engine, uow, row, connect, policy, t0 + timedelta(seconds=3))
            assert second.state == "Collecting"
            assert _collection(engine)["nextAttemptAt"] > _collection(engine)["lastAttemptAt"]
            last = collect(engine, uow, _row(engine), connect, policy, t0 + timedelta(seconds=11))
        finally:
            connect.close()
    assert last.state == "Failed" and sorted(last.requeued) == ["team-a/ev", "team-a/race"]
    for name in ("ev", "race"):
        status = workload_status(engine, "team-a", name)
        assert status["state"] == "Pending" and "admission" not in status
    (released,) = [e for e in ledger(engine, "workload.evicted") if e["reason"] == "ClusterDeleted"]
    assert released["workload"] == "race" and released["released"]["h100"]["nvidia.com/gpu"] == 16
    row = _row(engine)
    assert row.secret is None and row.status["collection"]["attempts"] == 3
    assert row.status["collection"]["requeued"] == ["team-a/ev", "team-a/race"]
    assert waiting([row]) == []  # ended: never tried again
    assert c1.token not in _everything_recorded(engine)


def _member_workload(cluster: RunningCluster) -> dict[str, Any] | None:
    with cluster.api_client() as api:
        items = kubernetes.client.CustomObjectsApi(api).list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", "team-a", "workloads"
        )["items"]
    admitted = [w for w in items if (w.get("status") or {}).get("admission")]
    return admitted[0] if admitted else None


def _deactivate(cluster: RunningCluster, workload: dict[str, Any]) -> None:
    with cluster.api_client() as api:
        kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
            "kueue.x-k8s.io",
            "v1beta2",
            "team-a",
            "workloads",
            workload["metadata"]["name"],
            {"spec": {"active": False}},
            _content_type="application/merge-patch+json",
        )


def _evicted(engine: sa.Engine, name: str, connect: Connector, config: Any, now: Any) -> bool:
    sync_once(engine, name, connect, config, now)
    return bool(workload_status(engine, "team-a", "ev")["state"] == "Evicted")


def test_unusable_credentials_are_reported_without_quoting_them(
    database_url: str, broker: str
) -> None:
    """A kubeconfig YAML cannot parse: the parser's message quotes the line
    (the token on it); what we raise, log and record names only the type."""
    config = settings(database_url, broker)
    broken = {"kubeconfig": "users:\n- name: x\n  user: {token: s3cr3t-t0ken: oops}\n"}
    secret = SecretBox(config.secret_key).seal(json.dumps(broken).encode())
    row = ClusterRow(
        "c9",
        str(uuid4()),
        1,
        1,
        {},
        {},
        {"server": "https://c9.example"},
        {},
        secret,
        datetime.now(UTC),
        True,
    )
    with pytest.raises(yaml.YAMLError, match="s3cr3t"):  # what the parser would say
        yaml.safe_load(broken["kubeconfig"])
    connect = Connector(config)
    with pytest.raises(MemberError) as raised:
        connect(row)
    error = raised.value
    assert "s3cr3t" not in str(error) and "ParserError" in str(error)
    assert error.__cause__ is None and error.__suppress_context__
