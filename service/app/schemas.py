"""The API's object shapes: Kueue ``v1beta2`` field names under
``apiVersion: quartermaster.dev/v1``.

Every model forbids unknown fields (a typo must not silently drop a quota)
and carries the rules Kueue's CRDs express in OpenAPI and CEL, so that what
the service accepts is what a member cluster's API server would accept after
translation. Rules that span objects (references, cohort cycles) live in
``service.app.validation``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from service.domain.quantity import QuantityError, parse_quantity

API_VERSION = "quartermaster.dev/v1"
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")

#: A label key, as Kubernetes takes it: a qualified name, a DNS prefix optional.
_KEY_SCHEMA = {"type": "string", "maxLength": 316, "pattern": _QUALIFIED.pattern}


def _map_schema(value: dict[str, Any], max_properties: int | None = None) -> WithJsonSchema:
    """The OpenAPI schema of a map with label keys, as tight as the validators
    below (which keep their own messages): clients generated from
    /openapi.json refuse what the server would."""
    schema: dict[str, Any] = {
        "type": "object",
        "propertyNames": _KEY_SCHEMA,
        "additionalProperties": value,
    }
    if max_properties is not None:
        schema["maxProperties"] = max_properties
    return WithJsonSchema(schema)


_VALUE_SCHEMA = {"type": "string", "maxLength": 63, "pattern": _LABEL_VALUE.pattern}
#: Labels, selectors' matchLabels, a flavor's nodeLabels (at most 8).
Labels = Annotated[dict[str, str], _map_schema(_VALUE_SCHEMA)]
NodeLabels = Annotated[dict[str, str], _map_schema(_VALUE_SCHEMA, 8)]
Annotations = Annotated[dict[str, str], _map_schema({"type": "string"})]

Name = Annotated[str, Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN.pattern)]
LabelName = Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_LABEL.pattern)]
ResourceName = Annotated[str, Field(min_length=1, max_length=253, pattern=_QUALIFIED.pattern)]
Quantity = Annotated[int | str, Field(description="A Kubernetes quantity, e.g. 8, '500m', '64Gi'")]


class Strict(BaseModel):
    # Strict: a boolean is not a number and a number is not a string, as in
    # the Kubernetes API server's OpenAPI validation.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


def _check_labels(labels: dict[str, str]) -> dict[str, str]:
    # fullmatch: ``$`` alone also matches before a trailing newline.
    for key, value in labels.items():
        if len(key) > 316 or not _QUALIFIED.fullmatch(key):
            raise ValueError(f"label key {key!r} is not a qualified name")
        if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            raise ValueError(f"label value {value!r} of {key!r} is not a valid label value")
    return labels


def check_quantity(value: int | str) -> int | str:
    if isinstance(value, bool):
        raise ValueError("must be a quantity, not a boolean")
    try:
        amount = parse_quantity(value)
    except QuantityError as error:
        raise ValueError(str(error)) from None
    if amount < 0:
        raise ValueError("must not be negative")
    return value


class ObjectMeta(Strict):
    name: Name
    namespace: LabelName | None = None
    labels: Labels = Field(default_factory=dict)
    annotations: Annotations = Field(default_factory=dict)
    resourceVersion: str | None = Field(
        default=None, description="Set on replace: the version you read (409 if stale)."
    )
    # Server-set fields a client may echo back from a GET; they are ignored.
    uid: str | None = None
    generation: int | None = None
    creationTimestamp: str | None = None

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_labels(value)

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if len(key) > 316 or not _QUALIFIED.fullmatch(key):
                raise ValueError(f"annotation key {key!r} is not a qualified name")
        if sum(len(k) + len(v) for k, v in value.items()) > 256 * 1024:
            raise ValueError("annotations may total at most 256 KiB")
        return value


# -- ResourceFlavor, Topology ------------------------------------------------------------


class Taint(Strict):
    key: ResourceName
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
    timeAdded: str | None = None


class Toleration(Strict):
    key: str | None = None
    operator: Literal["Equal", "Exists"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None

    @model_validator(mode="after")
    def _rules(self) -> Toleration:
        if not self.key and self.operator != "Exists":
            raise ValueError(
                "operator must be Exists when 'key' is empty, "
                "which means 'match all values and all keys'"
            )
        if self.tolerationSeconds is not None and self.effect != "NoExecute":
            raise ValueError("effect must be 'NoExecute' when 'tolerationSeconds' is set")
        if self.operator == "Exists" and self.value:
            raise ValueError("a value must be empty when 'operator' is 'Exists'")
        return self


class ResourceFlavorSpec(Strict):
    nodeLabels: NodeLabels = Field(default_factory=dict, max_length=8)
    nodeTaints: list[Taint] = Field(default_factory=list, max_length=8)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=8)
    topologyName: Name | None = None

    @field_validator("nodeLabels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_labels(value)

    @model_validator(mode="after")
    def _topology_needs_labels(self) -> ResourceFlavorSpec:
        if self.topologyName and not self.nodeLabels:
            raise ValueError("at least one nodeLabel is required when topology is set")
        return self


HOSTNAME = "kubernetes.io/hostname"


class TopologyLevel(Strict):
    nodeLabel: ResourceName


class TopologySpec(Strict):
    levels: list[TopologyLevel] = Field(min_length=1, max_length=16)

    @field_validator("levels")
    @classmethod
    def _levels(cls, levels: list[TopologyLevel]) -> list[TopologyLevel]:
        labels = [level.nodeLabel for level in levels]
        if len(set(labels)) != len(labels):
            raise ValueError("must be unique")
        if HOSTNAME in labels[:-1]:
            raise ValueError(
                "the kubernetes.io/hostname label can only be used at the lowest level of topology"
            )
        return levels


# -- quotas ------------------------------------------------------------------------------


class ResourceQuota(Strict):
    name: ResourceName
    nominalQuota: Quantity
    borrowingLimit: Quantity | None = None
    lendingLimit: Quantity | None = None

    @field_validator("nominalQuota", "borrowingLimit", "lendingLimit")
    @classmethod
    def _quantities(cls, value: int | str | None) -> int | str | None:
        return value if value is None else check_quantity(value)


class FlavorQuotas(Strict):
    name: Name
    resources: list[ResourceQuota] = Field(min_length=1, max_length=64)


class ResourceGroup(Strict):
    coveredResources: list[ResourceName] = Field(min_length=1, max_length=64)
    flavors: list[FlavorQuotas] = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _flavors_cover_group(self) -> ResourceGroup:
        covered = list(self.coveredResources)
        if len(set(covered)) != len(covered):
            raise ValueError("coveredResources must be unique")
        for index, flavor in enumerate(self.flavors):
            names = [r.name for r in flavor.resources]
            if names != covered:
                raise ValueError(
                    f"flavors[{index}] ({flavor.name}): resources must list exactly the "
                    f"group's coveredResources in the same order {covered}, got {names}"
                )
        return self


def check_groups(groups: list[ResourceGroup]) -> None:
    seen_resources: set[str] = set()
    seen_flavors: set[str] = set()
    for group in groups:
        for resource in group.coveredResources:
            if resource in seen_resources:
                raise ValueError(f"resource {resource} is covered by more than one group")
            seen_resources.add(resource)
        for flavor in group.flavors:
            if flavor.name in seen_flavors:
                raise ValueError(f"flavor {flavor.name} appears in more than one group")
            seen_flavors.add(flavor.name)


class FairSharing(Strict):
    weight: Quantity = 1

    @field_validator("weight")
    @classmethod
    def _weight(cls, value: int | str) -> int | str:
        return check_quantity(value)


class BorrowWithinCohort(Strict):
    policy: Literal["Never", "LowerPriority"] = "Never"
    maxPriorityThreshold: int | None = None


class PreemptionProtection(Strict):
    """Quartermaster's own (issue 24; Kueue's KEP-9876 is still open)."""

    minRuntimeSeconds: int = Field(
        default=0,
        ge=0,
        le=366 * 24 * 3600,
        description=(
            "How long a gang of this ClusterQueue runs before it may be preempted "
            "for borrowing reclaim beyond nominal, fair sharing or consolidation. "
            "Reclaim of a lender's nominal quota and priority within the "
            "ClusterQueue stay immediate unless reclaimNominal is Protected."
        ),
    )
    reclaimNominal: Literal["Immediate", "Protected"] = Field(
        default="Immediate",
        description="Protected: a lender's reclaim of its nominal quota waits too.",
    )
    islandGangGraceSeconds: int | None = Field(
        default=None,
        ge=0,
        le=366 * 24 * 3600,
        description=(
            "A gang of this ClusterQueue that must run whole in one island is not "
            "preempted for a workload of another ClusterQueue that asks for fewer "
            "accelerators and has no higher priority, lender's reclaim of nominal "
            "quota included, until that workload has been queued this long: its "
            "wait is bounded, and the gang is not sent back to wait for a whole "
            "island. Unset: no such grace."
        ),
    )


class PreemptionBudget(Strict):
    """A token bucket, like Armada's FairsharePreemptionRateLimit."""

    preemptions: int = Field(
        ge=0,
        le=1_000_000,
        description=(
            "At most this many protected preemptions of this ClusterQueue's gangs "
            "in a burst: the bucket's size, refilled at preemptions per periodSeconds."
        ),
    )
    periodSeconds: int = Field(ge=1, le=366 * 24 * 3600)


class Preemption(Strict):
    reclaimWithinCohort: Literal["Never", "LowerPriority", "Any"] = "Never"
    borrowWithinCohort: BorrowWithinCohort = Field(default_factory=BorrowWithinCohort)
    withinClusterQueue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = "Never"
    protection: PreemptionProtection | None = None
    budget: PreemptionBudget | None = None

    @model_validator(mode="after")
    def _reclaim(self) -> Preemption:
        if self.reclaimWithinCohort == "Never" and self.borrowWithinCohort.policy != "Never":
            raise ValueError("reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never")
        return self


class FlavorFungibility(Strict):
    whenCanBorrow: Literal["MayStopSearch", "TryNextFlavor"] = "MayStopSearch"
    whenCanPreempt: Literal["MayStopSearch", "TryNextFlavor"] = "TryNextFlavor"
    preference: Literal["BorrowingOverPreemption", "PreemptionOverBorrowing"] | None = None

    @model_validator(mode="after")
    def _preference(self) -> FlavorFungibility:
        both = self.whenCanBorrow == "TryNextFlavor" and self.whenCanPreempt == "TryNextFlavor"
        if self.preference is not None and not both:
            raise ValueError(
                "preference can only be set when both whenCanBorrow and whenCanPreempt "
                "are TryNextFlavor"
            )
        return self


class LabelSelectorRequirement(Strict):
    key: ResourceName
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"values must be non-empty for operator {self.operator}")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"values must be empty for operator {self.operator}")
        return self


class LabelSelector(Strict):
    matchLabels: Labels = Field(default_factory=dict)
    matchExpressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    @field_validator("matchLabels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_labels(value)


class SecurityPolicy(Strict):
    """Quartermaster's own: the floor every pod template a submission runs
    must meet (service/app/floor.py).

    ``level`` is the Kubernetes Pod Security Standard enforced, ``restricted``
    by default; the ``require*`` rules are ours; each ``allow*`` exempts one
    control. Relaxing any of them is a permission of its own (the
    ``security-admin`` role, not ``queue-admin``) and a ledger entry."""

    level: Literal["restricted", "baseline", "privileged"] = "restricted"
    requireImageDigest: bool = True
    forbidDefaultServiceAccount: bool = True
    requireRuntimeClassForGPU: bool = True
    allowPrivileged: bool = False
    allowPrivilegeEscalation: bool = False
    allowHostNetwork: bool = False
    allowHostPath: bool = False


WorkloadClass = Literal["training", "inference"]


class CohortSpec(Strict):
    parentName: Name | None = None
    resourceGroups: list[ResourceGroup] = Field(default_factory=list, max_length=16)
    fairSharing: FairSharing | None = None

    @model_validator(mode="after")
    def _groups(self) -> CohortSpec:
        check_groups(self.resourceGroups)
        return self


UNSUPPORTED_KUEUE_FIELDS = {
    "admissionChecksStrategy": "admission checks are not run by the central service",
    "admissionScope": "admission fair sharing is configured per LocalQueue's fairSharing",
    "concurrentAdmissionPolicy": "a workload is admitted once, into one cluster and flavor",
}


class ClusterQueueSpec(Strict):
    cohortName: Name | None = None
    resourceGroups: list[ResourceGroup] = Field(default_factory=list, max_length=16)
    queueingStrategy: Literal["StrictFIFO", "BestEffortFIFO"] = "BestEffortFIFO"
    namespaceSelector: LabelSelector | None = None
    flavorFungibility: FlavorFungibility = Field(default_factory=FlavorFungibility)
    preemption: Preemption = Field(default_factory=Preemption)
    fairSharing: FairSharing | None = None
    stopPolicy: Literal["None", "Hold", "HoldAndDrain"] = "None"
    workloadClass: WorkloadClass = Field(
        default="training",
        description="Quartermaster's own: the one class of workload this queue serves.",
    )
    securityPolicy: SecurityPolicy = Field(default_factory=SecurityPolicy)
    unsatisfiable: Literal["Hold", "Refuse"] = Field(
        default="Hold",
        description=(
            "Quartermaster's own: what becomes of a workload that could never be "
            "admitted, even on an empty fleet (too big for any island or cluster, no "
            "node with its flavor's labels, more than the quota could ever give): "
            "Hold keeps it pending as inadmissible, saying why; Refuse answers its "
            "submission 422 with that reason."
        ),
    )
    # Kueue fields Quartermaster does not implement: named, so that a Kueue
    # manifest gets a clear refusal instead of "unknown field".
    admissionChecksStrategy: dict[str, Any] | None = Field(default=None, exclude=True)
    admissionScope: dict[str, Any] | None = Field(default=None, exclude=True)
    concurrentAdmissionPolicy: dict[str, Any] | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _rules(self) -> ClusterQueueSpec:
        for field, why in UNSUPPORTED_KUEUE_FIELDS.items():
            if getattr(self, field) is not None:
                raise ValueError(
                    f"{field} is a Kueue field Quartermaster does not support: {why}; remove it"
                )
        check_groups(self.resourceGroups)
        if not self.cohortName:
            for group in self.resourceGroups:
                for flavor in group.flavors:
                    for resource in flavor.resources:
                        if resource.borrowingLimit is not None:
                            raise ValueError("borrowingLimit must be nil when cohort is empty")
                        if resource.lendingLimit is not None:
                            raise ValueError("lendingLimit must be nil when cohort is empty")
        return self


class LocalQueueSpec(Strict):
    clusterQueue: Name
    stopPolicy: Literal["None", "Hold", "HoldAndDrain"] = "None"
    fairSharing: FairSharing | None = None


class TrainingRuntimeSpec(BaseModel):
    """A TrainingRuntime's or ClusterTrainingRuntime's spec, as Kubeflow Trainer
    writes it: read against the runtime's own CRD (``service/app/crds``) by
    :func:`service.app.resources.parse_object`, field by field, and kept whole."""

    model_config = ConfigDict(extra="allow")


class WorkloadPriorityClassSpec(Strict):
    value: int = Field(ge=-2_147_483_648, le=1_000_000_000)
    description: str | None = Field(default=None, max_length=1024)


# -- member clusters ---------------------------------------------------------------------


class ClusterCredentials(Strict):
    """Write-only: encrypted at rest, never returned."""

    token: str | None = Field(default=None, min_length=1, max_length=16384)
    kubeconfig: str | None = Field(default=None, min_length=1, max_length=262144)

    @model_validator(mode="after")
    def _one(self) -> ClusterCredentials:
        if (self.token is None) == (self.kubeconfig is None):
            raise ValueError("give exactly one of token or kubeconfig")
        return self


class ClusterSpec(Strict):
    server: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+(/.*)?$",
        description="API server URL; may be omitted when the kubeconfig names it.",
    )
    caData: str | None = Field(default=None, max_length=65536, description="PEM, base64 or not")
    insecureSkipTLSVerify: bool = False
    cordoned: bool = Field(default=False, description="A cordoned cluster takes no new gangs.")
    backend: Literal["kueue", "volcano"] | None = Field(
        default=None,
        description=(
            "Which admission objects the member is reconciled to: Kueue's (ClusterQueue, "
            "LocalQueue, ...) or Volcano's (Queue, PodGroup). Unset: found by discovery "
            "(the CRDs the member serves) and recorded in status.backend."
        ),
    )
    credentials: ClusterCredentials | None = Field(
        default=None, description="Required on create; omit on replace to keep the stored ones."
    )

    @field_validator("server")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        # The spec is shown to every reader and written into the ledger for
        # good: credentials belong in spec.credentials, sealed at rest.
        if value is None:
            return value
        url = urlsplit(value)
        if url.username is not None or url.password is not None or "@" in url.netloc:
            raise ValueError("must not carry credentials (user:password@): use spec.credentials")
        if url.query or url.fragment or "?" in value or "#" in value:
            raise ValueError("must not carry a query or fragment: use spec.credentials")
        return value

    @model_validator(mode="after")
    def _server(self) -> ClusterSpec:
        if self.server is None and (self.credentials is None or not self.credentials.kubeconfig):
            raise ValueError("server is required unless a kubeconfig is given")
        return self


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True)
