"""What the stand-in members run, and the ledger as auditors read it, for
the usage tests: the two sides of ``service.ledger.accounting.audit``."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from service.app.workloads import Problems, pod_requests
from service.ledger.accounting import Holding
from service.ledger.chain import LedgerEntry
from service.ledger.postgres import PostgresLedgerReader
from sim.kubesim.testing import RunningCluster
from tests.workers.members import jobs
from workers.plan import WORKLOAD_ANNOTATION, member_status

GPU = "nvidia.com/gpu"


def running(clusters: list[RunningCluster]) -> dict[str, Holding]:
    """Every gang whose job runs on a member (not finished, not being
    deleted), with what its pods request, by ``namespace/name``."""
    out: dict[str, Holding] = {}
    for cluster in clusters:
        for job in jobs(cluster):
            meta = job.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                continue
            if member_status(job, None)["phase"] in ("Succeeded", "Failed"):
                continue
            key = str((meta.get("annotations") or {}).get(WORKLOAD_ANNOTATION, ""))
            pods = int((job.get("spec") or {}).get("parallelism") or 1)
            template: dict[str, Any] = (job.get("spec") or {}).get("template") or {}
            per_pod = pod_requests(template, "", Problems())
            if key in out:
                raise AssertionError(f"{key} runs on {out[key].cluster} and {cluster.name}")
            out[key] = Holding(cluster.name, {r: a * pods for r, a in per_pod.items()})
    return out


def entries(engine: sa.Engine) -> list[LedgerEntry]:
    return list(PostgresLedgerReader(engine).entries())


def closes(engine: sa.Engine, key: str) -> list[tuple[str, dict[str, Any]]]:
    """The entries that closed ``namespace/name``'s usage, in order."""
    kinds = ("workload.finished", "workload.preempted", "workload.evicted")
    return [
        (e.kind, dict(e.body))
        for e in entries(engine)
        if e.kind in kinds and f"{e.body['namespace']}/{e.body['workload']}" == key
    ]
