"""The Quartermaster Python SDK: typed models, a sync ``Client`` and an
``AsyncClient``, errors carrying problem+json, and ``qmctl``."""

from quartermaster_client._http import RetryPolicy
from quartermaster_client.aio import AsyncClient
from quartermaster_client.apply import Applied
from quartermaster_client.client import Client
from quartermaster_client.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    BeingDeleted,
    ConfigError,
    Conflict,
    FieldError,
    Forbidden,
    InUse,
    Invalid,
    NotFound,
    PolicyRefused,
    QuartermasterError,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    StaleVersion,
    TransportError,
    Unauthorized,
    UnknownReference,
    WatchTimeout,
)
from quartermaster_client.models import (
    Cluster,
    ClusterQueue,
    Cohort,
    Event,
    Explanation,
    LocalQueue,
    ObjectMeta,
    Resource,
    ResourceFlavor,
    Topology,
    Workload,
    WorkloadPriorityClass,
)
from quartermaster_client.outcomes import Outcome, outcome

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists",
    "ApiError",
    "Applied",
    "AsyncClient",
    "BadRequest",
    "BeingDeleted",
    "Client",
    "Cluster",
    "ClusterQueue",
    "Cohort",
    "ConfigError",
    "Conflict",
    "Event",
    "Explanation",
    "FieldError",
    "Forbidden",
    "InUse",
    "Invalid",
    "LocalQueue",
    "NotFound",
    "ObjectMeta",
    "Outcome",
    "PolicyRefused",
    "QuartermasterError",
    "RateLimited",
    "Resource",
    "ResourceFlavor",
    "RetryPolicy",
    "ServerError",
    "ServiceUnavailable",
    "StaleVersion",
    "Topology",
    "TransportError",
    "Unauthorized",
    "UnknownReference",
    "WatchTimeout",
    "Workload",
    "WorkloadPriorityClass",
    "outcome",
]
