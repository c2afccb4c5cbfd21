"""Typed objects of the Quartermaster API.

Attributes are snake_case; the wire names are Kueue's camelCase
(``nominal_quota`` is ``nominalQuota``). Every model keeps fields it does
not know (``extra="allow"``), so that an older client reads a newer server's
objects and writes them back unchanged; the server does the validating.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from pydantic.alias_generators import to_camel

API_VERSION = "quartermaster.dev/v1"
GPU = "nvidia.com/gpu"
Quantity = int | str


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    def to_dict(self) -> dict[str, Any]:
        """The wire form: camelCase, only the fields that were set."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude_none=True)


class ObjectMeta(Model):
    name: str
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None


class Condition(Model):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None


class Resource(Model):
    """The common shape: ``apiVersion``, ``kind``, ``metadata``."""

    KIND: ClassVar[str] = ""
    api_version: str = API_VERSION
    kind: str = ""
    metadata: ObjectMeta
    #: What the server warned of when it answered with this object (``Warning: 299``).
    _warnings: list[str] = PrivateAttr(default_factory=list)

    def model_post_init(self, context: Any) -> None:
        if not self.kind and self.KIND:
            self.kind = self.KIND
            self.model_fields_set.add("kind")
        self.model_fields_set.add("api_version")

    @property
    def warnings(self) -> list[str]:
        return self._warnings

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str | None:
        return self.metadata.namespace

    @property
    def resource_version(self) -> str | None:
        return self.metadata.resource_version


# -- ResourceFlavor, Topology ------------------------------------------------------------


class ResourceFlavorSpec(Model):
    node_labels: dict[str, str] = Field(default_factory=dict)
    node_taints: list[dict[str, Any]] = Field(default_factory=list)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    topology_name: str | None = None


class ResourceFlavor(Resource):
    KIND = "ResourceFlavor"
    spec: ResourceFlavorSpec = Field(default_factory=ResourceFlavorSpec)
    status: dict[str, Any] = Field(default_factory=dict)


class TopologyLevel(Model):
    node_label: str


class TopologySpec(Model):
    levels: list[TopologyLevel] = Field(default_factory=list)


class Topology(Resource):
    KIND = "Topology"
    spec: TopologySpec = Field(default_factory=TopologySpec)
    status: dict[str, Any] = Field(default_factory=dict)


# -- quotas ------------------------------------------------------------------------------


class ResourceQuota(Model):
    name: str
    nominal_quota: Quantity
    borrowing_limit: Quantity | None = None
    lending_limit: Quantity | None = None


class FlavorQuotas(Model):
    name: str
    resources: list[ResourceQuota]


class ResourceGroup(Model):
    covered_resources: list[str]
    flavors: list[FlavorQuotas]


class CohortSpec(Model):
    parent_name: str | None = None
    resource_groups: list[ResourceGroup] = Field(default_factory=list)
    fair_sharing: dict[str, Any] | None = None


class Cohort(Resource):
    KIND = "Cohort"
    spec: CohortSpec = Field(default_factory=CohortSpec)
    status: dict[str, Any] = Field(default_factory=dict)


class ClusterQueueSpec(Model):
    cohort_name: str | None = None
    resource_groups: list[ResourceGroup] = Field(default_factory=list)
    queueing_strategy: str | None = None
    namespace_selector: dict[str, Any] | None = None
    flavor_fungibility: dict[str, Any] | None = None
    preemption: dict[str, Any] | None = None
    fair_sharing: dict[str, Any] | None = None
    stop_policy: str | None = None
    workload_class: str | None = None
    security_policy: dict[str, Any] | None = None

    def nominal(self, resource: str = GPU) -> dict[str, Quantity]:
        """Nominal quota of ``resource`` per flavor."""
        return {
            flavor.name: quota.nominal_quota
            for group in self.resource_groups
            for flavor in group.flavors
            for quota in flavor.resources
            if quota.name == resource
        }


class ClusterQueueStatus(Model):
    pending_workloads: int | None = None
    admitted_workloads: int | None = None
    reserving_workloads: int | None = None
    flavors_usage: list[dict[str, Any]] = Field(default_factory=list)
    flavors_reservation: list[dict[str, Any]] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)


class ClusterQueue(Resource):
    KIND = "ClusterQueue"
    spec: ClusterQueueSpec = Field(default_factory=ClusterQueueSpec)
    status: ClusterQueueStatus = Field(default_factory=ClusterQueueStatus)


class LocalQueueSpec(Model):
    cluster_queue: str
    stop_policy: str | None = None
    fair_sharing: dict[str, Any] | None = None


class LocalQueue(Resource):
    KIND = "LocalQueue"
    spec: LocalQueueSpec
    status: dict[str, Any] = Field(default_factory=dict)


class WorkloadPriorityClass(Resource):
    """Flat, as Kueue's: ``value`` and ``description`` at the top level."""

    KIND = "WorkloadPriorityClass"
    value: int
    description: str | None = None


class TrainingRuntime(Resource):
    """Kubeflow Trainer's runtime, registered centrally: its spec as Trainer writes it."""

    KIND = "TrainingRuntime"
    spec: dict[str, Any]


class ClusterTrainingRuntime(Resource):
    KIND = "ClusterTrainingRuntime"
    spec: dict[str, Any]


# -- member clusters ---------------------------------------------------------------------


class ClusterSpec(Model):
    server: str | None = None
    ca_data: str | None = None
    insecure_skip_tls_verify: bool | None = Field(default=None, alias="insecureSkipTLSVerify")
    cordoned: bool | None = None
    backend: str | None = Field(
        default=None, description="kueue or volcano; unset: found by discovery (status.backend)"
    )
    credentials: dict[str, Any] | None = Field(
        default=None, description="Write-only: a token or a kubeconfig; never returned."
    )


class Cluster(Resource):
    KIND = "Cluster"
    spec: ClusterSpec = Field(default_factory=ClusterSpec)
    status: dict[str, Any] = Field(default_factory=dict)

    @property
    def backend(self) -> str | None:
        """Which admission objects the member is reconciled to: the
        registration's ``spec.backend``, else what discovery recorded."""
        found = self.spec.backend or self.status.get("backend")
        return str(found) if found else None


# -- workloads ---------------------------------------------------------------------------


class PodSet(Model):
    name: str = "main"
    count: int
    min_count: int | None = None
    template: dict[str, Any]
    topology_request: dict[str, Any] | None = None


class WorkloadSpec(Model):
    queue_name: str
    priority_class_name: str | None = None
    priority: int | None = None
    workload_class: str | None = None
    pod_sets: list[PodSet]
    #: A serving workload's: how many gangs of ``pod_sets`` it asks for.
    replicas: int | None = None
    cluster_selector: dict[str, Any] | None = None
    active: bool | None = None
    job: dict[str, Any] | None = None


class PodSetAssignment(Model):
    name: str = "main"
    count: int | None = None
    flavors: dict[str, str] = Field(default_factory=dict)
    resource_usage: dict[str, Quantity] = Field(default_factory=dict)
    islands: list[str] = Field(default_factory=list)
    placement: list[dict[str, Any]] = Field(
        default_factory=list, description="[{node, count}]: pods per node"
    )


class Admission(Model):
    """Where a gang runs: set by the admission cycle (see service/app/admission/__init__.py)."""

    cluster_queue: str | None = None
    cluster: str | None = None
    island: str | None = None
    pod_set_assignments: list[PodSetAssignment] = Field(default_factory=list)
    borrowed: dict[str, dict[str, Quantity]] = Field(
        default_factory=dict, description="{flavor: {resource: quantity}} beyond nominal quota"
    )
    preempted: list[str] = Field(default_factory=list)
    admitted_at: str | None = None

    @property
    def islands(self) -> list[str]:
        found: list[str] = []
        for assignment in self.pod_set_assignments:
            for island in assignment.islands:
                if island not in found:
                    found.append(island)
        if self.island and self.island not in found:
            found.append(self.island)
        return found

    @property
    def flavors(self) -> list[str]:
        found: list[str] = []
        for assignment in self.pod_set_assignments:
            for flavor in assignment.flavors.values():
                if flavor not in found:
                    found.append(flavor)
        return found


class ReplicaAdmission(Model):
    """One admitted replica of a serving workload (docs/serving.md)."""

    replica: int
    admission: Admission
    admitted_at: str | None = None


class WorkloadStatus(Model):
    state: str = "Pending"
    cluster_queue: str | None = None
    conditions: list[Condition] = Field(default_factory=list)
    admission: Admission | None = None
    #: A serving workload's: one per admitted replica, instead of ``admission``.
    replica_admissions: list[ReplicaAdmission] = Field(default_factory=list)
    pending_reason: str | None = None

    @property
    def admissions(self) -> list[Admission]:
        """Every admission it holds: its gang's, or each admitted replica's."""
        if self.admission is not None:
            return [self.admission]
        return [r.admission for r in self.replica_admissions]

    def condition(self, type_: str) -> Condition | None:
        """The latest condition of this type."""
        for condition in reversed(self.conditions):
            if condition.type == type_:
                return condition
        return None


class Workload(Resource):
    KIND = "Workload"
    spec: WorkloadSpec
    status: WorkloadStatus = Field(default_factory=WorkloadStatus)

    def requests(self, resource: str = GPU) -> int:
        """The whole gang's request of ``resource`` (integer resources only)."""
        total = 0
        for pod_set in self.spec.pod_sets:
            pod = (pod_set.template.get("spec") or {}) if isinstance(pod_set.template, dict) else {}
            for container in pod.get("containers") or []:
                resources = container.get("resources") or {}
                merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
                value = merged.get(resource)
                if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
                    total += int(value) * pod_set.count
        return total


# -- everything else ---------------------------------------------------------------------


class Event(Model):
    position: int
    stream: str
    version: int
    id: str
    type: str
    data: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    recorded_at: str | None = None

    @property
    def subject(self) -> str:
        """``Kind/namespace/name`` of the object the event is about."""
        kind = self.data.get("kind") or self.stream.split("-", 1)[0]
        ns = self.data.get("namespace")
        name = self.data.get("name") or self.stream.split("-", 1)[-1]
        return f"{kind}/{ns + '/' if ns else ''}{name}"


class Replicas(Model):
    """A serving workload's replicas: asked, admitted, and why the rest wait."""

    asked: int
    admitted: int
    waiting: int = 0
    reason: str | None = None
    waiting_for: str | None = None


class Explanation(Model):
    workload: str
    state: str
    reason: str | None = None
    message: str | None = None
    cluster_queue: str | None = None
    local_queue: str | None = None
    priority: int = 0
    requests: dict[str, int] = Field(default_factory=dict)
    position_in_queue: int | None = None
    pending_in_cluster_queue: int | None = None
    waiting_for: str | None = None
    admission: Admission | None = None
    replicas: Replicas | None = None


class BulkItemResult(Model):
    index: int
    name: str | None = None
    status: int
    resource_version: str | None = None
    uid: str | None = None
    error: dict[str, Any] | None = None


class BulkResult(Model):
    created: int
    failed: int
    results: list[BulkItemResult]


class WhoAmI(Model):
    name: str
    roles: list[str]
    namespaces: list[str]


class IssuedToken(Model):
    id: str
    name: str
    role: str
    namespaces: list[str] = Field(default_factory=list)
    token: str | None = None
    created_at: str | None = None
    expires_at: str | None = None


class LedgerEntry(Model):
    """One hash-chained ledger entry: ``hash`` covers the entry and ``prev_hash``."""

    seq: int
    id: str
    kind: str
    recorded_at: str
    body: dict[str, Any] = Field(default_factory=dict)
    prev_hash: str
    hash: str


class UsageRow(Model):
    """Resource-hours of one group in one period: ``hours`` what its
    admissions held, ``ran`` what their pods ran (by the members' own
    timestamps; absent from an older server). The group's fields
    (``namespace``, ``cluster_queue`` ...) are extra attributes."""

    period: str
    resource: str
    hours: float
    held: float | None = None
    ran: float | None = None

    def group(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: its items, the token for the next page, and the
    event position the list was read at."""

    items: list[T]
    continue_token: str | None
    resource_version: str
    kind: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


MODELS: dict[str, type[Resource]] = {
    m.KIND: m
    for m in (
        ResourceFlavor,
        Topology,
        Cohort,
        ClusterQueue,
        LocalQueue,
        WorkloadPriorityClass,
        Cluster,
        Workload,
    )
}


def parse_resource(data: dict[str, Any]) -> Resource:
    """The typed object for a wire object, by its ``kind``."""
    model = MODELS.get(str(data.get("kind", "")), Resource)
    return model.model_validate(data)


__all__ = [
    "API_VERSION",
    "GPU",
    "Admission",
    "BulkItemResult",
    "BulkResult",
    "Cluster",
    "ClusterQueue",
    "ClusterQueueSpec",
    "ClusterQueueStatus",
    "ClusterSpec",
    "Cohort",
    "CohortSpec",
    "Condition",
    "Event",
    "Explanation",
    "FlavorQuotas",
    "IssuedToken",
    "LedgerEntry",
    "LocalQueue",
    "LocalQueueSpec",
    "ObjectMeta",
    "Page",
    "PodSet",
    "PodSetAssignment",
    "Replicas",
    "Resource",
    "ResourceFlavor",
    "ResourceFlavorSpec",
    "ResourceGroup",
    "ResourceQuota",
    "Topology",
    "TopologyLevel",
    "TopologySpec",
    "UsageRow",
    "WhoAmI",
    "Workload",
    "WorkloadPriorityClass",
    "WorkloadSpec",
    "WorkloadStatus",
    "parse_resource",
]
