"""Invariant 5 by property: whatever the service's handlers did, in any
order, ``projections rebuild`` of every projection equals the live read
models row for row.

A Hypothesis state machine drives the handlers directly on real Postgres,
no worker processes: admin kinds created, changed and deleted; Clusters
registered, heartbeating (the sync writer), lost, deleted and collected
(the fleet loop's collection against a member that answers, one that does
not, and a deadline passed); tokens issued and revoked; workloads
submitted, refused and cancelled; admission cycles admitting and
preempting. It rebuilds now and then mid-history (later writes then build
on rebuilt rows) and at the end of every example.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from service.app.admission import AdmissionCycle
from service.app.auth import Principal, Role
from service.app.bootstrap import Services, bootstrap
from service.app.errors import AppError
from service.app.resources import Actor
from service.app.uow import SqlUnitOfWork
from service.config import Settings
from service.domain.times import rfc3339
from tests.foundation.rebuild import EmptyMember, differences, read_models, rebuild_all
from tests.harness import reset_database
from workers.clusters import MemberError
from workers.collect import CollectPolicy, collect, waiting
from workers.records import ClusterRow, append_cluster, clusters, load
from workers.sync import SYNCED, lose

ADMIN = Actor(Principal("test-admin", frozenset({Role.ADMIN}), frozenset({"*"})))
GPU = "nvidia.com/gpu"
CLUSTERS = ("c1", "c2")
WORKLOADS = ("w1", "w2", "w3", "w4")
QUEUES = ("cq", "cq2")

#: Twenty histories of up to 25 steps: about 20 s on a quiet 2-core box. No
#: example database: whether it finds a divergence never rests on a history
#: saved by an earlier run.
REBUILD_PROFILE = settings(
    database=None,
    report_multiple_bugs=False,
    max_examples=20,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _queue(name: str, gpus: int) -> dict[str, Any]:
    quotas = [
        {"name": "cpu", "nominalQuota": 1024},
        {"name": "memory", "nominalQuota": "8Ti"},
        {"name": GPU, "nominalQuota": gpus},
    ]
    return {
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", GPU],
                    "flavors": [{"name": "h100", "resources": quotas}],
                }
            ],
        },
    }


def _workload(name: str, gpus: int, urgent: bool, secure: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "registry.example/train@sha256:" + "a" * 64,
        "resources": {"requests": {"cpu": "8", "memory": "64Gi", GPU: gpus}},
    }
    pod: dict[str, Any] = {"spec": {"containers": [container]}}
    if secure:  # the security floor: a service account and the runtime class
        pod["spec"] |= {"serviceAccountName": "trainer", "runtimeClassName": "nvidia"}
    spec: dict[str, Any] = {
        "queueName": "train",
        "podSets": [{"name": "workers", "count": 1, "template": pod}],
    }
    if urgent:
        spec["priorityClassName"] = "urgent"
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": spec,
    }


def _nodes(cluster: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"{cluster}-n{n}",
            "flavor": "h100",
            "island": f"{cluster}-i0",
            "labels": {"sku": "h100", "kubernetes.io/hostname": f"{cluster}-n{n}"},
            "allocatable": {"cpu": "96", "memory": "1Ti", GPU: 8},
        }
        for n in range(count)
    ]


def _unreachable(row: ClusterRow) -> Any:
    raise MemberError(f"{row.name}: unreachable")


def _no_guard(uow: SqlUnitOfWork) -> None:
    return None


class ServiceHistory(RuleBasedStateMachine):
    """One history per example, on a database emptied for it."""

    def __init__(self, engine: sa.Engine, database_url: str) -> None:
        super().__init__()
        reset_database(engine)
        self.engine = engine
        self.services: Services = bootstrap(Settings(database_url=database_url, db_pool_size=2))
        self.cycle = AdmissionCycle(engine, self.services.unit_of_work)
        self.tokens: list[UUID] = []

    def teardown(self) -> None:
        try:
            self.rebuild_equals_live()
        finally:
            self.services.close()

    # -- helpers ---------------------------------------------------------------------------

    def _try(self, command: Any, *args: Any) -> None:
        """Run a handler; a refusal (in use, not found, being deleted) is a
        legitimate outcome of a random history."""
        with contextlib.suppress(AppError):
            command(ADMIN, *args)

    def _cluster(self, name: str) -> ClusterRow | None:
        with self.engine.connect() as conn:
            found = clusters(conn, name)
        return found[0] if found else None

    def _collecting(self) -> list[ClusterRow]:
        """Deleted Clusters whose collection has not ended."""
        with self.engine.connect() as conn:
            return waiting(clusters(conn))

    # -- the fleet's configuration ---------------------------------------------------------

    @initialize()
    def a_fleet(self) -> None:
        create = self.services.resources.create
        create(ADMIN, "resourceflavors", "", {"metadata": {"name": "h100"}, "spec": {}})
        create(ADMIN, "workloadpriorityclasses", "", {"metadata": {"name": "urgent"}, "value": 9})
        create(ADMIN, "clusterqueues", "", _queue("cq", 16))
        body = {"metadata": {"name": "train"}, "spec": {"clusterQueue": "cq"}}
        create(ADMIN, "localqueues", "team-a", body)
        self.register_or_relabel_cluster("c1", "eu")
        self.heartbeat("c1", 2)

    @rule(name=st.sampled_from(QUEUES), gpus=st.sampled_from([8, 16, 32]))
    def put_cluster_queue(self, name: str, gpus: int) -> None:
        body = _queue(name, gpus)
        try:
            self.services.resources.replace(ADMIN, "clusterqueues", "", name, body, None)
        except AppError:
            self._try(self.services.resources.create, "clusterqueues", "", body)

    @rule(queue=st.sampled_from(QUEUES))
    def point_local_queue(self, queue: str) -> None:
        body = {"metadata": {"name": "train"}, "spec": {"clusterQueue": queue}}
        self._try(self.services.resources.create, "localqueues", "team-a", body)
        self._try(self.services.resources.replace, "localqueues", "team-a", "train", body, None)

    @rule(
        what=st.sampled_from(
            [
                ("clusterqueues", "", "cq"),
                ("clusterqueues", "", "cq2"),
                ("localqueues", "team-a", "train"),
                ("workloadpriorityclasses", "", "urgent"),
                ("resourceflavors", "", "h100"),
            ]
        )
    )
    def delete_config(self, what: tuple[str, str, str]) -> None:
        self._try(self.services.resources.delete, *what, None)

    @rule()
    def recreate_config(self) -> None:
        create = self.services.resources.create
        self._try(create, "resourceflavors", "", {"metadata": {"name": "h100"}, "spec": {}})
        body = {"metadata": {"name": "urgent"}, "value": 9}
        self._try(create, "workloadpriorityclasses", "", body)

    # -- member clusters -------------------------------------------------------------------

    @rule(name=st.sampled_from(CLUSTERS), region=st.sampled_from(["eu", "us"]))
    def register_or_relabel_cluster(self, name: str, region: str) -> None:
        body = {
            "metadata": {"name": name, "labels": {"region": region}},
            "spec": {"server": f"https://{name}.example:6443", "credentials": {"token": "t"}},
        }
        row = self._cluster(name)
        if row is None or row.deleted:
            self._try(self.services.resources.create, "clusters", "", body)
        else:
            patch = {"metadata": {"labels": {"region": region}}}
            self._try(self.services.resources.patch, "clusters", "", name, patch, None)

    @rule(name=st.sampled_from(CLUSTERS), nodes=st.integers(1, 3))
    def heartbeat(self, name: str, nodes: int) -> None:
        """What sync writes for a member that answers: its inventory."""
        row = self._cluster(name)
        if row is None or row.deleted:
            return
        now = datetime.now(UTC)
        status = {
            **row.status,
            "state": "Ready",
            "lastHeartbeat": rfc3339(now),
            "inventory": {"nodes": _nodes(name, nodes)},
        }
        with self.services.unit_of_work() as uow:
            append_cluster(uow, row, SYNCED, status, "test:sync", now)
            uow.commit()

    @rule(name=st.sampled_from(CLUSTERS))
    def lose_cluster(self, name: str) -> None:
        """Silent past its lease: Lost, its gangs requeued whole."""
        row, rows, _ = load(self.engine, name)
        if row is None or row.deleted or row.state == "Lost":
            return
        now = datetime.now(UTC)
        with self.services.unit_of_work() as uow:
            lose(uow, row, rows, row.created_at, now)
            uow.commit()

    @rule(name=st.sampled_from(CLUSTERS))
    def delete_cluster(self, name: str) -> None:
        self._try(self.services.resources.delete, "clusters", "", name, None)

    @precondition(lambda self: bool(self._collecting()))
    @rule(outcome=st.sampled_from(["collected", "unreachable", "given up"]))
    def collect_deleted_clusters(self, outcome: str) -> None:
        """One attempt of the fleet loop's collection at each deleted
        Cluster whose collection has not ended."""
        rows = self._collecting()
        deadline = 0.0 if outcome == "given up" else 3600.0
        policy = CollectPolicy(first_backoff=0.0, max_backoff=0.0, deadline=deadline)
        member = (lambda _: EmptyMember()) if outcome == "collected" else _unreachable
        for row in rows:
            uow = self.services.unit_of_work
            collect(self.engine, uow, row, member, policy, datetime.now(UTC))  # type: ignore[arg-type]

    # -- tokens ----------------------------------------------------------------------------

    @rule(role=st.sampled_from([Role.ADMIN, Role.SUBMITTER, Role.AUDITOR]))
    def issue_token(self, role: Role) -> None:
        namespaces = ["team-a"] if role is Role.SUBMITTER else []
        # Token names are never reused: one per issue.
        name = f"{role.value}-{len(self.tokens)}"
        issued = self.services.authenticator.issue("test", name, role, namespaces, None)
        self.tokens.append(issued.id)

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def revoke_token(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(self.tokens))
        self.services.authenticator.revoke("test", token, None)

    # -- workloads -------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(WORKLOADS),
        gpus=st.sampled_from([8, 16]),
        urgent=st.booleans(),
        secure=st.booleans(),
    )
    def submit(self, name: str, gpus: int, urgent: bool, secure: bool) -> None:
        body = _workload(name, gpus, urgent, secure)
        self._try(self.services.submissions.submit, "team-a", body)

    @rule(name=st.sampled_from(WORKLOADS))
    def cancel(self, name: str) -> None:
        self._try(self.services.submissions.cancel, "team-a", name)

    @rule()
    def admission_cycle(self) -> None:
        self.cycle.run(_no_guard)

    # -- the property ----------------------------------------------------------------------

    @rule()
    def rebuild_now(self) -> None:
        self.rebuild_equals_live()

    def rebuild_equals_live(self) -> None:
        live = read_models(self.engine)
        rebuild_all(self.engine)
        assert differences(live, read_models(self.engine)) == []


def test_rebuild_equals_live_after_any_history(engine: sa.Engine, database_url: str) -> None:
    run_state_machine_as_test(
        lambda: ServiceHistory(engine, database_url),  # type: ignore[arg-type]
        settings=REBUILD_PROFILE,
    )
