"""Fencing: no gang runs in two clusters while a member is cut off from the centre.

A lease alone cannot do it: a member the centre cannot reach is not dead,
and its pods run on. So each side holds its half (docs/fencing.md):

- The centre (sync, every pass that reached the member) renews a
  ``coordination.k8s.io/v1`` Lease in ``quartermaster-system`` on the member,
  ``leaseDurationSeconds`` = the fence time. Before it may write, it records
  in Postgres how long its writes may go on (``status.fence.writableUntil``,
  extended only by a heartbeat, i.e. a pass that reached the member); it
  requeues a lost member's gangs only once that promise is older than the
  fence time plus the margin.
- The agent (``quartermaster fence-agent``, in the member) reads that Lease
  every poll and, once its ``renewTime`` has not changed for the fence time
  by the agent's own monotonic clock, deletes every job of ours on the
  member. Centre and member clocks never meet: only their rates must agree
  (the margin covers the drift).

Deleting rather than suspending: a suspended job is unsuspended by the
member's Kueue while its Workload stays admitted there, and Volcano members
have no such switch; deletion is the same on every member, the centre
requeues the gang anyway, and reconcile collects the rest when the member
returns.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes
from kubernetes.client import CoordinationV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from service.domain.times import parse_time
from workers.clusters import APPLY, KINDS, Member, MemberError, Ref
from workers.plan import MANAGED, MANAGED_LABEL, RUN_KINDS, SERVING_JOB_KINDS

log = logging.getLogger(__name__)

NAMESPACE = "quartermaster-system"
#: The centre's heartbeat, which the agent reads.
CENTRE_LEASE = "quartermaster-centre"
#: The agent's own report, which the centre reads.
AGENT_LEASE = "quartermaster-fence-agent"
AGENT_LABEL = "quartermaster.dev/fence-agent"
POLL_ANNOTATION = "quartermaster.dev/poll-seconds"
FENCED_ANNOTATION = "quartermaster.dev/fenced"
#: Member wall time at which the agent last saw the heartbeat change, and
#: that heartbeat's renewTime: where a restarted agent's count resumes.
SEEN_AT_ANNOTATION = "quartermaster.dev/heartbeat-seen-at"
SEEN_ANNOTATION = "quartermaster.dev/heartbeat-renew-time"

Obj = dict[str, Any]


def micro(at: datetime) -> str:
    """RFC 3339 with microseconds (a Lease's MicroTime; a promise that must not round down)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- the centre's half ---------------------------------------------------------------------


@dataclass(frozen=True)
class FencePolicy:
    """The centre's fencing knobs (workers/settings.py: validated together)."""

    seconds: float = 0.0  # 0: no fencing
    margin: float = 0.0
    #: How far past a heartbeat the centre promises its writes may go on.
    window: float = 0.0
    #: The longest one write attempt takes (connect and read timeouts).
    attempt: float = 0.0
    #: The agent poll the margin covers.
    poll: float = 0.0
    heartbeat_interval: float = 0.0

    @classmethod
    def of(cls, settings: Any) -> FencePolicy:
        return cls(
            seconds=settings.fence_seconds,
            margin=settings.fence_margin,
            window=settings.fence_window,
            attempt=settings.member_connect_timeout + settings.member_read_timeout,
            poll=settings.fence_poll_interval,
            heartbeat_interval=settings.heartbeat_interval,
        )


NO_FENCE = FencePolicy()


def heartbeat_lease(seconds: float, now: datetime) -> Obj:
    """The centre's Lease on the member: held by ``quartermaster``, for ``seconds``."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": CENTRE_LEASE,
            "namespace": NAMESPACE,
            "labels": {MANAGED_LABEL: "true"},
        },
        "spec": {
            "holderIdentity": "quartermaster",
            "leaseDurationSeconds": max(1, math.floor(seconds)),
            "renewTime": micro(now),
        },
    }


def renew(member: Member, seconds: float, now: datetime) -> None:
    """Write the heartbeat (creating our namespace the first time)."""
    lease = heartbeat_lease(seconds, now)
    try:
        member.apply(lease)
    except MemberError as error:
        if error.status != 404:
            raise
        member.apply(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": NAMESPACE, "labels": {MANAGED_LABEL: "true"}},
            }
        )
        member.apply(lease)


def agent_lease(member: Member) -> Obj | None:
    """The agent's report on the member, if one is there: read by name, so
    that the centre's role reads that one Lease (deploy/member), not all."""
    return member.read(Ref("Lease", NAMESPACE, AGENT_LEASE))


def status(
    previous: Mapping[str, Any] | None,
    agent: Mapping[str, Any] | None,
    policy: FencePolicy,
    now: datetime,
) -> Obj:
    """``status.fence`` of a Cluster after a pass that reached it: the write
    promise (``writableUntil``) and whether a fence agent is reporting
    (its Lease changed lately, by the centre's clock) with a poll the
    margin covers. ``guaranteed`` is what an operator looks at."""
    previous = previous or {}
    out: Obj = {"seconds": policy.seconds}
    if policy.seconds > 0:
        out["writableUntil"] = micro(now + timedelta(seconds=policy.window))
    seen = dict(previous.get("agent") or {})
    if agent is None:
        out["agent"] = {"reporting": False}
        out["guaranteed"] = False
        out["reason"] = "NoFenceAgent" if policy.seconds > 0 else "FencingOff"
        return out
    spec = agent.get("spec") or {}
    annotations = (agent.get("metadata") or {}).get("annotations") or {}
    renewed = str(spec.get("renewTime") or "")
    observed = parse_time(seen.get("observedAt"))
    if renewed != seen.get("renewTime") or observed is None:
        observed = now
    poll = _seconds(annotations.get(POLL_ANNOTATION))
    # Silent: its Lease unchanged for two of our heartbeats (or polls) and a poll.
    stale_after = 2 * max(policy.heartbeat_interval, poll or 0.0) + (poll or 0.0)
    reporting = (now - observed).total_seconds() <= stale_after
    out["agent"] = {
        "reporting": reporting,
        "holder": str(spec.get("holderIdentity") or ""),
        "pollSeconds": poll,
        "fenced": annotations.get(FENCED_ANNOTATION) == "true",
        "renewTime": renewed,
        "observedAt": micro(observed),
    }
    reason = ""
    if policy.seconds <= 0:
        reason = "FencingOff"
    elif not reporting:
        reason = "FenceAgentSilent"
    elif poll is None or poll > policy.poll:
        reason = "FenceAgentPollTooSlow"  # the margin does not cover its poll
    out["guaranteed"] = not reason
    if reason:
        out["reason"] = reason
    return out


def _seconds(value: Any) -> float | None:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def settled(fence: Mapping[str, Any]) -> Obj:
    """What of ``status.fence`` is worth a heartbeat write when it changes."""
    agent = fence.get("agent") or {}
    return {
        "guaranteed": fence.get("guaranteed"),
        "reason": fence.get("reason"),
        "reporting": agent.get("reporting"),
        "holder": agent.get("holder"),
        "fenced": agent.get("fenced"),
    }


def may_write(fence: Mapping[str, Any] | None, attempt: float, now: datetime) -> bool:
    """Whether a heartbeat write started ``now`` ends within the promise recorded."""
    until = parse_time((fence or {}).get("writableUntil"))
    return until is not None and now + timedelta(seconds=attempt) <= until


def may_requeue(fence: Mapping[str, Any] | None, policy: FencePolicy, now: datetime) -> bool:
    """A lost member's gangs may go elsewhere only once its agent has surely
    stopped them: the last heartbeat write ended by ``writableUntil``, the
    agent saw it within a poll, fenced a fence time later by its clock and
    had the pods gone within the stop time — all inside ``seconds + margin``."""
    until = parse_time((fence or {}).get("writableUntil"))
    if until is None:
        return True  # never promised: no heartbeat was ever written
    seconds = float((fence or {}).get("seconds") or policy.seconds)
    return (now - until).total_seconds() > seconds + policy.margin


# -- the member's half ---------------------------------------------------------------------


@dataclass
class Step:
    """One poll's outcome (for logs and tests)."""

    heartbeat: bool  # a centre heartbeat has been seen
    age: float  # seconds since it last changed, by the agent's clock
    fence: float  # the fence time it carries
    fenced: bool
    deleted: int = 0


class FenceAgent:
    """Reads the centre's heartbeat Lease every ``poll`` seconds and, once it
    is older than its fence time (time since the agent saw it change, on
    ``clock``, a monotonic clock), deletes every job of ours (label
    ``quartermaster.dev/managed=true``) on the cluster, each poll while it
    stays stale. Reports itself in its own Lease, which also lets a
    restarted agent resume its count (by the member's wall clock, ``wall``)."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        *,
        poll: float = 10.0,
        identity: str = "fence-agent",
        namespace: str = NAMESPACE,
        timeout: tuple[float, float] = (5.0, 10.0),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.poll = poll
        self.identity = identity
        self.namespace = namespace
        self.timeout = timeout
        self.clock = clock
        self.wall = wall
        self._leases = CoordinationV1Api(api)
        self._custom = CustomObjectsApi(api)
        self._seen: str | None = None  # the heartbeat's renewTime last seen
        self._changed: float | None = None  # when it last changed, on clock
        self._seen_at: datetime | None = None  # the same, on the member's wall clock
        self._fence = 0.0
        self._resumed = False

    # -- reading ---------------------------------------------------------------------

    def _read(self, name: str) -> Obj | None:
        try:
            raw: Any = self._leases.read_namespaced_lease(
                name, self.namespace, _preload_content=False, _request_timeout=self.timeout
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        lease: Obj = json.loads(raw.data)
        return lease

    def _resume(self, heartbeat: str) -> None:
        """A starting agent: count from what its last run recorded, so a
        restart never grants the cluster a fresh fence time. Without a
        record (a fresh install) the count starts now."""
        self._resumed = True
        mine = self._read(AGENT_LEASE)
        if mine is None:
            return
        notes = (mine.get("metadata") or {}).get("annotations") or {}
        if notes.get(SEEN_ANNOTATION) == heartbeat:
            since = parse_time(notes.get(SEEN_AT_ANNOTATION))
        else:  # it changed while we were down: after our last report at the earliest
            since = parse_time((mine.get("spec") or {}).get("renewTime"))
        if since is None:
            return
        self._seen = heartbeat
        self._seen_at = since
        self._changed = self.clock() - max(0.0, (self.wall() - since).total_seconds())

    def observe(self) -> tuple[bool, float]:
        """Read the heartbeat; (seen one ever, its age by our clock)."""
        lease = self._read(CENTRE_LEASE)
        now = self.clock()
        if lease is not None:
            spec = lease.get("spec") or {}
            renewed = str(spec.get("renewTime") or "")
            self._fence = float(spec.get("leaseDurationSeconds") or self._fence or 0)
            if not self._resumed:
                self._resume(renewed)
            if renewed != self._seen:
                self._seen, self._changed, self._seen_at = renewed, now, self.wall()
        if self._changed is None:
            return False, 0.0
        return True, now - self._changed

    # -- acting ----------------------------------------------------------------------

    def stop_jobs(self) -> int:
        """Delete every job and serving object of ours (a serving replica is
        a gang too, requeued elsewhere with the rest), one collection request
        per kind and namespace (background: the garbage collector takes the
        pods)."""
        deleted = 0
        for kind in RUN_KINDS:
            k = KINDS.get(kind)
            if k is None:
                continue
            try:
                raw: Any = self._custom.list_cluster_custom_object(
                    k.group,
                    k.version,
                    k.plural,
                    label_selector=MANAGED,
                    _preload_content=False,
                    _request_timeout=self.timeout,
                )
            except ApiException as error:
                if error.status == 404:
                    continue  # not served here
                if error.status == 403 and kind in SERVING_JOB_KINDS:
                    continue  # an agent installed before serving: none of ours run here
                raise
            items = json.loads(raw.data).get("items") or []
            namespaces = sorted({str(i["metadata"]["namespace"]) for i in items})
            for namespace in namespaces:
                self._custom.delete_collection_namespaced_custom_object(
                    k.group,
                    k.version,
                    namespace,
                    k.plural,
                    label_selector=MANAGED,
                    propagation_policy="Background",
                    _request_timeout=self.timeout,
                )
            deleted += len(items)
        return deleted

    def report(self, fenced: bool) -> None:
        """The agent's own Lease: alive (renewTime), its poll, whether it fences."""
        annotations = {POLL_ANNOTATION: f"{self.poll:g}", FENCED_ANNOTATION: str(fenced).lower()}
        if self._seen is not None and self._seen_at is not None:
            annotations[SEEN_ANNOTATION] = self._seen
            annotations[SEEN_AT_ANNOTATION] = micro(self._seen_at)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": AGENT_LEASE,
                "namespace": self.namespace,
                "labels": {AGENT_LABEL: "true"},
                "annotations": annotations,
            },
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, math.ceil(3 * self.poll)),
                "renewTime": micro(self.wall()),
            },
        }
        request = self.api.param_serialize(
            method="PATCH",
            resource_path="/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
            path_params={"namespace": self.namespace, "name": AGENT_LEASE},
            query_params=[("fieldManager", "quartermaster-fence-agent"), ("force", True)],
            header_params={"Accept": "application/json", "Content-Type": APPLY},
            body=json.dumps(body),
            auth_settings=["BearerToken"],
        )
        answer: Any = self.api.call_api(*request, _request_timeout=self.timeout)
        answer.read()
        if not 200 <= answer.status <= 299:
            raise ApiException.from_response(http_resp=answer, body=None, data=None)

    def step(self) -> Step:
        """One poll: observe; past the fence time, read again and stop the
        jobs (the second read keeps a heartbeat that just resumed from
        losing what the centre dispatched after it); report."""
        heartbeat, age = self.observe()
        fenced = heartbeat and self._fence > 0 and age > self._fence
        deleted = 0
        if fenced:
            heartbeat, age = self.observe()
            fenced = age > self._fence
            if fenced:
                deleted = self.stop_jobs()
                if deleted:
                    log.warning(
                        "centre heartbeat %.1f s old (fence %g s): deleted %d jobs",
                        age,
                        self._fence,
                        deleted,
                    )
        self.report(fenced)
        return Step(heartbeat, age, self._fence, fenced, deleted)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = self.clock()
            try:
                self.step()
            except Exception as error:  # its own API server away: try again next poll
                log.warning("fence agent poll failed: %s", error)
            stop.wait(max(0.0, self.poll - (self.clock() - started)))


__all__ = [
    "AGENT_LEASE",
    "CENTRE_LEASE",
    "NAMESPACE",
    "NO_FENCE",
    "FenceAgent",
    "FencePolicy",
    "Step",
    "agent_lease",
    "heartbeat_lease",
    "may_requeue",
    "may_write",
    "renew",
    "settled",
    "status",
]
