"""Teams' commands on Workloads: submit (one, in a group commit, or in bulk),
cancel, explain.

``values`` (what the path passes around) ← ``repository`` (queries) ←
``resolver`` (queues, priority classes, a ClusterQueue's rules) and ``writes``
(events, rows, ledger entries) ← ``explain`` ← ``service`` (the commands).
"""

from service.app.submissions.service import BULK_CHUNK, MAX_BULK, SubmissionService
from service.app.submissions.values import (
    ItemResult,
    Obj,
    Outcome,
    Submission,
    Target,
    Unsatisfiable,
    Unstorable,
)
from service.app.submissions.writes import new_uuids, submitted_entry

__all__ = [
    "BULK_CHUNK",
    "MAX_BULK",
    "ItemResult",
    "Obj",
    "Outcome",
    "Submission",
    "SubmissionService",
    "Target",
    "Unsatisfiable",
    "Unstorable",
    "new_uuids",
    "submitted_entry",
]
