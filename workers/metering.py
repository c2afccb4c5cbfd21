"""What ran, read back from a member before its pods go (docs/billing.md).

Every pod of ours carries our finalizer, ``quartermaster.dev/usage``, from
its creation (the job's pod templates: workers/plan/jobs.py), as the Job
controller holds its pods with ``batch.kubernetes.io/job-tracking`` and
Kueue the plain pods it manages with ``kueue.x-k8s.io/managed``: whoever
deletes the pod (reconcile removing a stopped job, the member's own
eviction, the fence agent), its kubelet terminates it and writes
``finishedAt``, and the terminated pod stays until the centre has read it.
Once every pod of an admission has ended and its job is being removed,
what they ran — each pod from its ``status.startTime`` to its containers'
last ``terminated.finishedAt``, times its requests — is written to the
ledger (``workload.ran``, in a transaction of its own), and only then is
the finalizer removed. A crash between the two writes nothing twice (the
entry's id is the admission's). A pod without the finalizer (a job of an
older version) is *held* with it before its job is deleted.

Ended pods whose job is gone (deleted by the fence agent, or by a pass
that did not finish) are found by every fleet-loop pass (:meth:`Meter.sweep`).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy import Engine

from service.app.lifecycle import PodTimes, measured_run
from service.app.uow import SqlUnitOfWork
from service.app.workloads import Problems, pod_requests
from service.domain.times import parse_time
from service.ledger.chain import NewLedgerEntry
from service.ledger.schema import ledger_entries
from workers.clusters import Member, MemberError
from workers.plan import ADMISSION_LABEL, JOB_KINDS, WorkloadView, admission_id
from workers.plan.names import ADMISSION_ID_ANNOTATION, USAGE_FINALIZER
from workers.plan.views import Ref

log = logging.getLogger(__name__)

HOLD_FINALIZER = USAGE_FINALIZER
HOLD_LABEL = "quartermaster.dev/usage-hold"
_TERMINAL = ("Succeeded", "Failed")
#: Admissions in one label selector (its request line stays a few kB).
_BATCH = 100

Obj = dict[str, Any]

__all__ = ["HOLD_FINALIZER", "HOLD_LABEL", "Meter", "admission_ids", "ended", "pod_times"]


# -- reading a pod (pure) --------------------------------------------------------------------


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def ended(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` runs no more: terminal, or being deleted before it
    ever started (a kubelet starts nothing that is being deleted)."""
    status = pod.get("status") or {}
    if status.get("phase") in _TERMINAL:
        return True
    return bool(_meta(pod).get("deletionTimestamp")) and not status.get("startTime")


def pod_times(pod: Mapping[str, Any]) -> PodTimes:
    """When ``pod`` ran, by its member: from ``status.startTime`` to the
    last ``state.terminated.finishedAt`` of its containers (None, None when
    it never ran, or has not ended), and its requests."""
    status = pod.get("status") or {}
    started = parse_time(status.get("startTime"))
    finishes = [
        parse_time(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for c in status.get("containerStatuses") or ()
    ]
    known = [f for f in finishes if f is not None]
    finished = max(known) if known and status.get("phase") in _TERMINAL else None
    requests = pod_requests(pod, "", Problems())
    if started is None or finished is None:
        return PodTimes(None, None, requests)
    return PodTimes(started, finished, requests)


def _admission_of(obj: Mapping[str, Any]) -> str:
    return str((_meta(obj).get("labels") or {}).get(ADMISSION_LABEL, ""))


def admission_ids(actual: Iterable[Mapping[str, Any]], rows: Iterable[Any]) -> dict[str, str]:
    """Ledger admission ids by the admission label of the member's jobs:
    from a job's annotation, else from a workload whose status still holds
    that admission (a job dispatched before jobs carried it)."""
    out: dict[str, str] = {}
    for obj in actual:
        annotation = (_meta(obj).get("annotations") or {}).get(ADMISSION_ID_ANNOTATION)
        if obj.get("kind") in JOB_KINDS and annotation and _admission_of(obj):
            out[_admission_of(obj)] = str(annotation)
    for row in rows:
        view = WorkloadView(row.namespace, row.name, row.uid, row.spec, row.status)
        if view.admission.get("id"):
            out.setdefault(admission_id(view), str(view.admission["id"]))
    return out


def _by_admission(pods: Iterable[Obj]) -> dict[str, list[Obj]]:
    out: dict[str, list[Obj]] = defaultdict(list)
    for pod in pods:
        if _admission_of(pod):
            out[_admission_of(pod)].append(pod)
    return out


def _held(pod: Mapping[str, Any]) -> bool:
    return HOLD_FINALIZER in (_meta(pod).get("finalizers") or ())


# -- the ledger's side -----------------------------------------------------------------------


def _admitted(engine: Engine, ids: Iterable[str]) -> dict[str, Mapping[str, Any]]:
    """The ``workload.admitted`` bodies of ``ids``, by id."""
    wanted = sorted({UUID(i) for i in ids})
    if not wanted:
        return {}
    query = sa.select(ledger_entries.c.entry_id, ledger_entries.c.body).where(
        ledger_entries.c.kind == "workload.admitted",
        ledger_entries.c.entry_id.in_(wanted),
    )
    with engine.connect() as conn:
        return {str(i): body for i, body in conn.execute(query)}


def _commit(engine: Engine, entries: Sequence[NewLedgerEntry]) -> None:
    if not entries:
        return
    with SqlUnitOfWork(engine) as uow:
        uow.record(list(entries))
        uow.commit()


# -- the member's side -----------------------------------------------------------------------


@dataclass
class Meter:
    """One reconcile pass's reading of what ran on ``member``; ``ids``:
    ledger admission ids by admission label (:func:`admission_ids`)."""

    member: Member
    engine: Engine
    clock: Callable[[], datetime]
    ids: dict[str, str] = field(default_factory=dict)
    #: Admissions recorded by this pass.
    recorded: list[str] = field(default_factory=list)

    def _pods(self, admissions: Sequence[str]) -> list[Obj]:
        wanted = sorted({a for a in admissions if a})
        pods: list[Obj] = []
        for start in range(0, len(wanted), _BATCH):
            chosen = ",".join(wanted[start : start + _BATCH])
            pods += self.member.pods(f"{ADMISSION_LABEL} in ({chosen})")
        return pods

    def before_stop(self, draining: Sequence[str]) -> None:
        """Before the jobs of ``draining`` are deleted: record the
        admissions whose pods have all ended, hold the pods of the others."""
        by = _by_admission(self._pods(draining))
        done = {a: pods for a, pods in by.items() if all(ended(p) for p in pods)}
        self._record(done)
        for admission, pods in by.items():
            if admission not in done:
                for pod in pods:
                    self._hold(pod, admission)

    def after_stop(self, admissions: Sequence[str]) -> None:
        """Record those of ``admissions`` whose pods have all ended now."""
        by = _by_admission(self._pods(admissions))
        self._record({a: pods for a, pods in by.items() if all(ended(p) for p in pods)})

    def sweep(self, present: Iterable[str]) -> None:
        """Record and let go the pods of admissions whose job is gone from
        the member (``present``: the admissions whose job is there), once
        they have all ended."""
        held = _by_admission(
            p for p in self.member.pods(ADMISSION_LABEL, "status.phase!=Running") if _held(p)
        )
        gone = sorted(set(held) - set(present))
        self._learn(p for a in gone for p in held[a])
        everyone = _by_admission(self._pods(gone))
        self._record({a: p for a, p in everyone.items() if all(ended(x) for x in p)})

    def let_go(self) -> None:
        """Record what has ended and release every pod of ours (the member
        leaves the fleet: no pass will read them again)."""
        pods = self.member.pods(ADMISSION_LABEL)
        self._learn(pods)
        by = _by_admission(pods)
        self._record({a: p for a, p in by.items() if all(ended(x) for x in p)})
        self._release(p for a, group in by.items() if a not in self.recorded for p in group)

    def _learn(self, pods: Iterable[Obj]) -> None:
        """Ledger admission ids from the pods' own annotation."""
        for pod in pods:
            annotation = (_meta(pod).get("annotations") or {}).get(ADMISSION_ID_ANNOTATION)
            if annotation and _admission_of(pod):
                self.ids.setdefault(_admission_of(pod), str(annotation))

    def wait_stopped(self, refs: list[Ref], admissions: Sequence[str], timeout: float) -> list[str]:
        """Poll until every one of ``refs`` is gone and every pod of
        ``admissions`` has ended (held or gone); what is left after
        ``timeout``."""
        left: list[Ref] = [*refs]
        running: list[Obj] = []
        deadline = time.monotonic() + timeout
        while True:
            left = [r for r in left if self.member.exists(r)]
            running = [] if left else [p for p in self._pods(admissions) if not ended(p)]
            if (not left and not running) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        return [str(r) for r in left] + [f"Pod {_meta(p).get('name')}" for p in running]

    # -- holds and records -------------------------------------------------------------------

    def _hold(self, pod: Obj, admission: str) -> None:
        meta = _meta(pod)
        if _held(pod) or meta.get("deletionTimestamp"):
            return  # a pod being deleted takes no new finalizer
        patch: Obj = {"metadata": {"finalizers": [HOLD_FINALIZER], "labels": {HOLD_LABEL: "true"}}}
        if admission in self.ids:
            patch["metadata"]["annotations"] = {ADMISSION_ID_ANNOTATION: self.ids[admission]}
        try:
            self.member.patch_pod(str(meta.get("namespace")), str(meta.get("name")), patch)
        except MemberError as error:
            if error.status != 422:  # 422: its deletion began meanwhile
                raise
            log.info("%s: pod %s not held: %s", self.member.name, meta.get("name"), error)

    def _release(self, pods: Iterable[Obj]) -> None:
        patch = {
            "metadata": {
                "$deleteFromPrimitiveList/finalizers": [HOLD_FINALIZER],
                "labels": {HOLD_LABEL: None},
            }
        }
        for pod in pods:
            if _held(pod):
                meta = _meta(pod)
                self.member.patch_pod(str(meta.get("namespace")), str(meta.get("name")), patch)

    def _record(self, done: Mapping[str, list[Obj]]) -> None:
        """Write what the pods of each admission in ``done`` ran (one
        transaction), then let their holds go."""
        if not done:
            return
        admitted = _admitted(self.engine, (self.ids[a] for a in done if a in self.ids))
        now = self.clock()
        entries = []
        for admission, pods in sorted(done.items()):
            ledger_id = self.ids.get(admission)
            body = admitted.get(ledger_id or "")
            if ledger_id is None or body is None:
                log.warning("%s: admission %s has no ledger entry", self.member.name, admission)
                continue
            entries.append(measured_run(body, ledger_id, [pod_times(p) for p in pods], now))
            self.recorded.append(admission)
        _commit(self.engine, entries)
        self._release(p for pods in done.values() for p in pods)
