"""What the stand-in members run and ran, and the ledger as auditors read
it, for the usage tests: the two sides of ``service.ledger.accounting.audit``
and of ``ran_mismatches``."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from service.app.workloads import Problems, pod_requests
from service.ledger.accounting import Holding
from service.ledger.chain import LedgerEntry
from service.ledger.postgres import PostgresLedgerReader
from sim.kubesim.testing import RunningCluster
from tests.workers.members import jobs
from workers.plan import WORKLOAD_ANNOTATION, WORKLOAD_LABEL, member_status, workload_label

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


def intervals(cluster: RunningCluster) -> list[dict[str, Any]]:
    """The stand-in kubelet's record of every pod's running intervals (what
    ``/_admin/intervals`` serves), read in its process."""

    def read() -> list[dict[str, Any]]:
        hooks = (getattr(c, "running_intervals", None) for c in cluster.cluster.controllers)
        return next((hook() for hook in hooks if hook is not None), [])

    return cluster.run(read)


def reported(
    clusters: list[RunningCluster], workloads: list[str], resource: str = GPU
) -> tuple[dict[str, int], list[str]]:
    """``resource`` * seconds that the members' kubelets ran, per
    ``namespace/name`` of ``workloads``: per pod, its request times its
    interval truncated to whole seconds as its timestamps are
    (``int(end) - int(start)``); and the pods still running."""
    by_label = {workload_label(*key.split("/", 1)): key for key in workloads}
    totals: dict[str, int] = {}
    running: list[str] = []
    for cluster in clusters:
        for record in intervals(cluster):
            key = by_label.get(str(record["labels"].get(WORKLOAD_LABEL, "")))
            if key is None:
                continue
            if record["end"] is None:
                running.append(f"{cluster.name}/{record['name']}")
                continue
            seconds = int(record["end"]) - int(record["start"])
            amount = int(record["requests"].get(resource, 0)) * seconds
            totals[key] = totals.get(key, 0) + amount
    return totals, running
