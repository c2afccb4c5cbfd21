"""What the submit path passes around: a submission, what it resolves to,
what it came to, and the refusals of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy.exc import DataError

from service.app.errors import AppError
from service.app.resources import Actor
from service.app.workloads import WorkloadObject
from service.engine import Snapshot

Obj = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """What a submission resolves to: its ClusterQueue and priority."""

    cluster_queue: str
    priority: int
    requests: dict[str, int]
    """The whole gang's requests per resource (canonical units)."""


@dataclass(frozen=True)
class ItemResult:
    index: int
    name: str | None
    status: int
    error: AppError | None = None
    object: Obj | None = None


@dataclass(frozen=True)
class Submission:
    """A parsed submission on its way into a unit of work."""

    actor: Actor
    namespace: str
    workload: WorkloadObject


#: What a submission came to: the created Workload, or why it was refused.
Outcome = Obj | AppError


@dataclass(frozen=True)
class Accepted:
    submission: Submission
    target: Target
    version: int
    """The stream's version before this submission (a deleted workload's
    name starts again after its tombstone)."""


class Unstorable(AppError):
    """What validation let through but Postgres cannot hold (a non-finite
    number in a pod template, say); the same answer as the API's for a
    DataError."""

    status, kind, title = 422, "invalid-request", "Invalid request"


REFUSED_BY_DATABASE = (DataError, psycopg.DataError)


class Unsatisfiable(AppError):
    """A workload that no empty fleet could admit, submitted to a ClusterQueue
    whose ``spec.unsatisfiable`` is ``Refuse``."""

    status, kind, title = 422, "unsatisfiable", "Can never be admitted"


#: The fleet as configured, fetched at most once per unit of work, and only
#: when a ClusterQueue of it refuses what can never be admitted.
Fleet = Callable[[], Snapshot]
