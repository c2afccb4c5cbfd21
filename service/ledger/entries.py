"""What the ledger records: one stable, validated body schema per entry kind.

The kind names and fields below are a public contract (auditors parse them,
the chain hashes them); ``docs/ledger.md`` documents every field. A change
that is not adding an optional field gets a new kind (``….v2``), never an
edit: old entries must keep meaning what they meant when they were signed.

Conventions shared by every kind, so that the auditor API filters by plain
top-level keys: ``namespace``, ``workload``, ``local_queue``,
``cluster_queue``, ``cluster`` and ``actor`` when they apply. Amounts are
``{flavor: {resource: amount}}`` in canonical integer units (``cpu`` in
millicores, ``memory`` in bytes, accelerators in devices), so a filter by
flavor is a key test on ``reserved``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar, Literal
from uuid import UUID

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from service.ledger.chain import NewLedgerEntry

Amounts = dict[str, dict[str, NonNegativeInt]]
"""``{flavor: {resource: amount}}`` in canonical units."""

ResourceSeconds = dict[str, dict[str, NonNegativeFloat]]
"""``{flavor: {resource: amount * seconds}}``."""


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    KIND: ClassVar[str]


class WorkloadBody(Body):
    namespace: str
    workload: str
    local_queue: str
    cluster_queue: str


class UnitBody(WorkloadBody):
    """An entry of one admission, which for a serving workload admitted
    replica by replica is one unit's (docs/serving.md): ``replica`` names
    it. Absent from the stored body when ``None``, so that a one-gang
    workload's entries read as they did before the field existed."""

    replica: NonNegativeInt | None = Field(
        default=None, description="Of a serving workload's unit: its replica index."
    )

    @model_serializer(mode="wrap")
    def _without_absent_replica(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        if dumped.get("replica") is None:
            dumped.pop("replica", None)
        return dumped


class WorkloadSubmitted(WorkloadBody):
    KIND: ClassVar[str] = "workload.submitted"
    actor: str
    workload_class: Literal["training", "inference"]
    priority: int
    requests: dict[str, NonNegativeInt] = Field(
        description="Total of all pod sets per resource, before a flavor is chosen."
    )


class WorkloadAdmitted(UnitBody):
    KIND: ClassVar[str] = "workload.admitted"
    cluster: str
    flavors: dict[str, str] = Field(description="Resource → the flavor it was assigned.")
    island: str | None = Field(description="Fabric island, when the gang asked for one.")
    reserved: Amounts
    borrowed: Amounts = Field(description="The part of `reserved` above nominal quota.")
    reason: str


class WorkloadPreempted(UnitBody):
    KIND: ClassVar[str] = "workload.preempted"
    cluster: str
    reason: Literal[
        "InClusterQueue",
        "InCohortReclamation",
        "InCohortFairSharing",
        "InCohortReclaimWhileBorrowing",
        "Consolidation",
    ]
    preemptor: str = Field(description="`namespace/name` of the workload that needed the quota.")
    preemptor_cluster_queue: str
    cohort_path: list[str] = Field(description="Cohorts from the ClusterQueue up to the root.")
    released: Amounts
    work_destroyed_gpu_seconds: float | None = Field(
        default=None,
        description=(
            "Accelerator-seconds run since the victim's last checkpoint (or its "
            "admission): the work the preemption threw away (issue 24)."
        ),
    )
    budgeted: bool = Field(
        default=False,
        description=(
            "The preemption took a token of the victim's ClusterQueue's "
            "preemption.budget; the scheduler derives the buckets from these entries."
        ),
    )


class WorkloadEvicted(UnitBody):
    KIND: ClassVar[str] = "workload.evicted"
    cluster: str
    reason: str = Field(description="Kueue eviction reason, e.g. PodsReadyTimeout, ClusterLost.")
    message: str
    requeued: bool
    released: Amounts


class WorkloadFinished(UnitBody):
    KIND: ClassVar[str] = "workload.finished"
    cluster: str
    outcome: Literal["succeeded", "failed", "cancelled"]
    started_at: datetime
    finished_at: datetime
    consumed: ResourceSeconds = Field(
        description="Measured by the member cluster: amount * seconds per flavor and resource."
    )
    gpu_seconds: NonNegativeFloat
    cpu_seconds: NonNegativeFloat = Field(description="Core-seconds.")
    memory_gib_seconds: NonNegativeFloat


class PodRun(BaseModel):
    """Pods of one admission that ran over the same whole seconds, by the
    member's own timestamps: together they requested ``amounts``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    started_at: datetime
    finished_at: datetime
    pods: PositiveInt
    amounts: Amounts

    @model_validator(mode="after")
    def _ordered(self) -> PodRun:
        if self.finished_at < self.started_at:
            raise ValueError("a run finishes no earlier than it starts")
        return self


class WorkloadRan(UnitBody):
    """What one admission's pods ran on their member, start to end, as the
    member reports it (``measured: member``); or, for a member the centre
    lost, an estimate up to the last time it was seen running
    (``measured: estimate``), which a later ``member`` entry of the same
    admission supersedes. docs/billing.md says why and how."""

    KIND: ClassVar[str] = "workload.ran"
    cluster: str
    admission: str = Field(description="The entry_id of the admission's workload.admitted entry.")
    measured: Literal["member", "estimate"]
    runs: list[PodRun] = Field(description="Empty: nothing of it ran.")
    gpu_seconds: NonNegativeInt = Field(description="Device-seconds, every accelerator resource.")
    cpu_seconds: NonNegativeFloat = Field(description="Core-seconds.")
    memory_gib_seconds: NonNegativeFloat
    seen_until: datetime | None = Field(
        default=None,
        description="Estimates: the member's time when it was last seen running it.",
    )
    at_most_until: datetime | None = Field(
        default=None,
        description="Estimates: by when the member's fence agent had stopped it, at the latest"
        " (null when no agent guards the member).",
    )


class ConfigChanged(Body):
    """An admin's change to quota or configuration, before and after."""

    KIND: ClassVar[str] = "config.changed"
    actor: str
    object_kind: str = Field(description="ClusterQueue, Cohort, ResourceFlavor, Cluster, ….")
    namespace: str | None = None
    name: str
    before: dict[str, Any] | None = Field(description="The spec before; null when created.")
    after: dict[str, Any] | None = Field(description="The spec after; null when deleted.")


class QuotaChanged(ConfigChanged):
    """A change of a ClusterQueue's or Cohort's quotas (its own kind, so that
    auditors can ask for quota history alone)."""

    KIND: ClassVar[str] = "quota.changed"
    object_kind: Literal["ClusterQueue", "Cohort"]


class SecurityRelaxed(Body):
    """A ClusterQueue's security floor made weaker: who did it and which
    rules, beside the ``quota.changed`` entry of the same change."""

    KIND: ClassVar[str] = "security.relaxed"
    actor: str
    cluster_queue: str
    relaxed: list[str] = Field(min_length=1, description="`rule: before -> after`, each weakened.")


class BrokenRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    rule: str
    message: str


class PolicyRefused(Body):
    KIND: ClassVar[str] = "policy.refused"
    actor: str
    namespace: str
    workload: str
    local_queue: str | None
    rules: list[BrokenRule] = Field(min_length=1)


class ClusterLost(Body):
    KIND: ClassVar[str] = "cluster.lost"
    cluster: str
    last_heartbeat: datetime | None
    requeued: list[str] = Field(description="`namespace/name` of the gangs requeued whole.")


class ClusterReturned(Body):
    KIND: ClassVar[str] = "cluster.returned"
    cluster: str
    lost_at: datetime | None


BODIES: Mapping[str, type[Body]] = {
    model.KIND: model
    for model in (
        WorkloadSubmitted,
        WorkloadAdmitted,
        WorkloadPreempted,
        WorkloadEvicted,
        WorkloadFinished,
        WorkloadRan,
        ConfigChanged,
        QuotaChanged,
        SecurityRelaxed,
        PolicyRefused,
        ClusterLost,
        ClusterReturned,
    )
}
KINDS = tuple(BODIES)


class UnknownKind(ValueError):
    pass


def new_entry(body: Body, entry_id: UUID, recorded_at: datetime) -> NewLedgerEntry:
    """The entry to append for ``body``; ``entry_id`` makes a retry a no-op."""
    return NewLedgerEntry(entry_id, body.KIND, body.model_dump(mode="json"), recorded_at)


def parse_body(kind: str, body: Mapping[str, Any]) -> Body:
    """Validate a stored body against its kind's schema."""
    model = BODIES.get(kind)
    if model is None:
        raise UnknownKind(kind)
    return model.model_validate(dict(body))
