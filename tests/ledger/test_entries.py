"""Entry bodies: every kind validates, round-trips through the chain, refuses
unknown fields, and is documented field by field in docs/ledger.md."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.ledger.entries import (
    BODIES,
    BrokenRule,
    ClusterLost,
    ClusterReturned,
    ConfigChanged,
    PodRun,
    PolicyRefused,
    QuotaChanged,
    SecurityRelaxed,
    UnknownKind,
    WorkloadAdmitted,
    WorkloadEvicted,
    WorkloadFinished,
    WorkloadPreempted,
    WorkloadRan,
    WorkloadSubmitted,
    new_entry,
    parse_body,
)
from service.ledger.memory import InMemoryLedger

T0 = datetime(2026, 11, 29, tzinfo=UTC)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "ledger.md"
Q = {"namespace": "team-a", "workload": "train", "local_queue": "lq", "cluster_queue": "cq"}
GANG = {"h100": {"nvidia.com/gpu": 64, "cpu": 512_000}}

EXAMPLES = [
    WorkloadSubmitted(
        **Q, actor="alice", workload_class="training", priority=10, requests={"nvidia.com/gpu": 64}
    ),
    WorkloadAdmitted(
        **Q,
        cluster="c1",
        flavors={"nvidia.com/gpu": "h100", "cpu": "h100"},
        island="block-3",
        reserved=GANG,
        borrowed={"h100": {"nvidia.com/gpu": 8}},
        reason="fits nominal quota in cq, island block-3 has 8 free nodes",
    ),
    WorkloadPreempted(
        **Q,
        cluster="c1",
        reason="InCohortReclamation",
        preemptor="team-b/serve",
        preemptor_cluster_queue="cq-b",
        cohort_path=["research", "root"],
        released=GANG,
    ),
    WorkloadEvicted(
        **Q,
        cluster="c1",
        reason="PodsReadyTimeout",
        message="5m without all pods ready",
        requeued=True,
        released=GANG,
    ),
    WorkloadFinished(
        **Q,
        cluster="c1",
        outcome="succeeded",
        started_at=T0,
        finished_at=T0,
        consumed={"h100": {"nvidia.com/gpu": 230400.0}},
        gpu_seconds=230400.0,
        cpu_seconds=1.5,
        memory_gib_seconds=0.25,
    ),
    WorkloadRan(
        **Q,
        cluster="c1",
        admission="5f0c5f3e-6a43-4c1b-9a57-3b1f1e2f7a10",
        measured="member",
        runs=[PodRun(started_at=T0, finished_at=T0, pods=8, amounts=GANG)],
        gpu_seconds=0,
        cpu_seconds=0,
        memory_gib_seconds=0,
    ),
    ConfigChanged(
        actor="root", object_kind="ResourceFlavor", name="h100", before=None, after={"x": 1}
    ),
    QuotaChanged(
        actor="root",
        object_kind="ClusterQueue",
        name="cq",
        before={"nominalQuota": 64},
        after={"nominalQuota": 128},
    ),
    PolicyRefused(
        actor="bob",
        namespace="team-a",
        workload="bad",
        local_queue="lq",
        rules=[BrokenRule(rule="no-privileged", message="privileged containers are refused")],
    ),
    SecurityRelaxed(
        actor="token:sec-officer", cluster_queue="cq-a", relaxed=["level: restricted -> baseline"]
    ),
    ClusterLost(cluster="c1", last_heartbeat=T0, requeued=["team-a/train"]),
    ClusterReturned(cluster="c1", lost_at=T0),
]


def test_every_kind_has_an_example() -> None:
    assert {type(e).KIND for e in EXAMPLES} == set(BODIES)


@pytest.mark.parametrize("body", EXAMPLES, ids=lambda b: type(b).KIND)
def test_a_body_round_trips_through_the_chain(body: Any) -> None:
    ledger = InMemoryLedger()
    (entry,) = ledger.append([new_entry(body, uuid.uuid4(), T0)])
    assert entry.kind == type(body).KIND
    assert parse_body(entry.kind, entry.body) == body
    assert ledger.verify().ok


@pytest.mark.parametrize("body", EXAMPLES, ids=lambda b: type(b).KIND)
def test_unknown_fields_are_refused(body: Any) -> None:
    with pytest.raises(ValidationError):
        parse_body(type(body).KIND, {**body.model_dump(mode="json"), "surprise": 1})


def test_bad_values_are_refused() -> None:
    admitted = EXAMPLES[1].model_dump(mode="json")
    with pytest.raises(ValidationError):
        parse_body("workload.admitted", {**admitted, "reserved": {"h100": {"cpu": -1}}})
    with pytest.raises(ValidationError):
        parse_body("workload.preempted", {**EXAMPLES[2].model_dump(mode="json"), "reason": "x"})
    with pytest.raises(ValidationError):
        PolicyRefused(actor="a", namespace="n", workload="w", local_queue=None, rules=[])
    with pytest.raises(UnknownKind):
        parse_body("workload.teleported", {})


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_every_kind_and_field_is_documented(kind: str) -> None:
    sections = DOCS.read_text(encoding="utf-8").split("\n### ")
    headed = [s for s in sections if f"`{kind}`" in s.splitlines()[0]]
    assert len(headed) == 1, f"{kind} has no section of its own in docs/ledger.md"
    for name in BODIES[kind].model_fields:
        assert f"`{name}`" in headed[0], f"{kind}.{name} is not documented in its section"
