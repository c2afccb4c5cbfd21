"""Every event type the service appends and every outbox topic it publishes.

Each event type names the stream categories it may be appended to (the
``<category>`` of ``<category>-<id>``) and the read models that must apply
it; the projections derive what they apply from here, and the unit of work
refuses an append this registry does not declare. docs/events.md says what
each event's data holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

#: Read models, by table name (a projection's ``tables``).
RESOURCES: Final = "resources"
API_TOKENS: Final = "api_tokens"

#: Streams of the API's objects, one per kind: ``clusterqueue-team-a``,
#: ``workload-team-a/train-42``. Every event on them carries the object's
#: whole state, so the ``resources`` read model must apply each.
ADMIN_STREAMS: Final = frozenset(
    {
        "resourceflavor",
        "topology",
        "cohort",
        "clusterqueue",
        "workloadpriorityclass",
        "localqueue",
        "cluster",
        "trainingruntime",
        "clustertrainingruntime",
    }
)
WORKLOAD_STREAMS: Final = frozenset({"workload"})
OBJECT_STREAMS: Final = ADMIN_STREAMS | WORKLOAD_STREAMS


@dataclass(frozen=True, slots=True)
class EventType:
    name: str
    streams: frozenset[str]
    read_models: frozenset[str]
    meaning: str


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    meaning: str


class UnregisteredEvent(ValueError):
    """An append of a type not declared here, or to a stream its declaration
    does not name."""


_EVENTS: dict[str, EventType] = {}
_TOPICS: dict[str, Topic] = {}
EVENTS: Final[Mapping[str, EventType]] = MappingProxyType(_EVENTS)
TOPICS: Final[Mapping[str, Topic]] = MappingProxyType(_TOPICS)


def declare(name: str, streams: frozenset[str], read_models: frozenset[str], meaning: str) -> str:
    """Register an event type; answer its name, for the writers to append.
    Only this module declares the service's own (a test's stand-in consumer
    may declare its test event)."""
    if name in _EVENTS:
        raise ValueError(f"event type {name!r} is declared twice")
    _EVENTS[name] = EventType(name, streams, read_models, meaning)
    return name


def declare_topic(name: str, meaning: str) -> str:
    if name in _TOPICS:
        raise ValueError(f"topic {name!r} is declared twice")
    _TOPICS[name] = Topic(name, meaning)
    return name


def applied_to(read_model: str) -> frozenset[str]:
    """The event types ``read_model`` must apply."""
    return frozenset(e.name for e in _EVENTS.values() if read_model in e.read_models)


def require_registered(stream: str, event_type: str) -> None:
    """Raise unless ``event_type`` is declared for ``stream``'s category."""
    declared = _EVENTS.get(event_type)
    if declared is None:
        raise UnregisteredEvent(
            f"event type {event_type!r} is not registered (service/domain/events.py)"
        )
    category = stream.split("-", 1)[0]
    if category not in declared.streams:
        raise UnregisteredEvent(
            f"event type {event_type!r} is not registered for {category}- streams"
        )


_OBJECT = frozenset({RESOURCES})
_TOKEN = frozenset({API_TOKENS})
_NONE: frozenset[str] = frozenset()

# -- the API's admin kinds -------------------------------------------------------------------
RESOURCE_CHANGED = declare(
    "ResourceChanged", ADMIN_STREAMS, _OBJECT, "an admin kind created, replaced or patched"
)
RESOURCE_DELETED = declare(
    "ResourceDeleted", ADMIN_STREAMS, _OBJECT, "an admin kind deleted (a tombstone)"
)

# -- workloads -------------------------------------------------------------------------------
WORKLOAD_SUBMITTED = declare(
    "WorkloadSubmitted", WORKLOAD_STREAMS, _OBJECT, "accepted by the API; Pending"
)
WORKLOAD_CANCELLED = declare(
    "WorkloadCancelled", WORKLOAD_STREAMS, _OBJECT, "cancelled: Cancelled, or Cancelling"
)
WORKLOAD_PENDING = declare(
    "WorkloadPending", WORKLOAD_STREAMS, _OBJECT, "the admission cycle's reason it waits"
)
WORKLOAD_ADMITTED = declare(
    "WorkloadAdmitted",
    WORKLOAD_STREAMS,
    _OBJECT,
    "admitted: cluster, island, flavors (or serving units: their replicas)",
)
WORKLOAD_PREEMPTED = declare(
    "WorkloadPreempted",
    WORKLOAD_STREAMS,
    _OBJECT,
    "preempted whole, or serving units (their replicas); quota released",
)
WORKLOAD_EVICTED = declare(
    "WorkloadEvicted",
    WORKLOAD_STREAMS,
    _OBJECT,
    "evicted whole, or serving units (their replicas); quota released",
)
WORKLOAD_SCALED = declare(
    "WorkloadScaled", WORKLOAD_STREAMS, _OBJECT, "a serving workload's replicas changed"
)
WORKLOAD_REQUEUED = declare(
    "WorkloadRequeued", WORKLOAD_STREAMS, _OBJECT, "its job gone from the member: Pending again"
)
WORKLOAD_DISPATCHED = declare(
    "WorkloadDispatched", WORKLOAD_STREAMS, _OBJECT, "its job is on the member cluster"
)
WORKLOAD_RUNNING = declare("WorkloadRunning", WORKLOAD_STREAMS, _OBJECT, "every pod ready")
WORKLOAD_REPLICAS_AVAILABLE = declare(
    "WorkloadReplicasAvailable",
    WORKLOAD_STREAMS,
    _OBJECT,
    "a serving workload's replicas available on a member changed",
)
WORKLOAD_CHECKPOINTED = declare(
    "WorkloadCheckpointed", WORKLOAD_STREAMS, _OBJECT, "its job reported a newer checkpoint"
)
WORKLOAD_FINISHED = declare(
    "WorkloadFinished",
    WORKLOAD_STREAMS,
    _OBJECT,
    "succeeded or failed on its member; or serving units released by a scale down",
)

# -- member clusters (sync and the fleet loop) -----------------------------------------------
_CLUSTER = frozenset({"cluster"})
CLUSTER_SYNCED = declare("ClusterSynced", _CLUSTER, _OBJECT, "inventory and heartbeat")
CLUSTER_LOST = declare("ClusterLost", _CLUSTER, _OBJECT, "silent past its lease; gangs requeued")
CLUSTER_COLLECTING = declare(
    "ClusterCollecting", _CLUSTER, _OBJECT, "a deleted Cluster's sweep tried, not done"
)
CLUSTER_COLLECTED = declare(
    "ClusterCollected", _CLUSTER, _OBJECT, "a deleted Cluster swept; credentials dropped"
)
CLUSTER_COLLECTION_FAILED = declare(
    "ClusterCollectionFailed", _CLUSTER, _OBJECT, "a deleted Cluster's sweep given up"
)
CLUSTER_CREDENTIALS_ROTATED = declare(
    "ClusterCredentialsRotated", _CLUSTER, _OBJECT, "its credentials sealed under a new key"
)

# -- the rest: tokens, refusals, dead letters ------------------------------------------------
_TOKENS = frozenset({"token"})
TOKEN_ISSUED = declare("TokenIssued", _TOKENS, _TOKEN, "a bearer token (its hash only)")
TOKEN_REVOKED = declare("TokenRevoked", _TOKENS, _TOKEN, "a bearer token revoked")
SUBMISSION_REFUSED = declare(
    "SubmissionRefused", frozenset({"refusal"}), _NONE, "a submission broke a security floor"
)
MESSAGE_DEAD_LETTERED = declare(
    "MessageDeadLettered", frozenset({"deadletter"}), _NONE, "an outbox message given up"
)

# -- outbox topics (their consumers: workers/tasks.py) ---------------------------------------
ADMISSION_WAKE = declare_topic("admission.wake", "run the admission cycle soon")
RECONCILE_CLUSTER = declare_topic("reconcile.cluster", "reconcile one member cluster")

__all__ = [
    "API_TOKENS",
    "EVENTS",
    "OBJECT_STREAMS",
    "RESOURCES",
    "TOPICS",
    "EventType",
    "Topic",
    "UnregisteredEvent",
    "applied_to",
    "declare",
    "declare_topic",
    "require_registered",
]
