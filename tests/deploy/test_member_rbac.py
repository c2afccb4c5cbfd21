"""Least privilege, proven: the workers' token on a stand-in member holds
exactly the rules ``deploy/member`` renders (``kubectl kustomize``), and the
real workers run the whole road with them — dispatch of every job kind,
preemption, eviction, sync, garbage collection of leftover jobs, deletion of
the Cluster — with nothing refused and every grant used. Then each grant in
turn is taken away, and the operation that needs it is shown to get 403.

One member, one centre and one set of workers serve the whole module
(tests/deploy/member_world.py); the rules are swapped on the stand-in
between cases."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest
import sqlalchemy as sa

from sim.kubesim.auth import grants
from tests.deploy.member_world import (
    ACCOUNT,
    JOB_KINDS,
    QUEUE_KINDS,
    RUN_KINDS,
    SERVING_KINDS,
    WORKERS,
    World,
    gang,
    rendered,
    serving,
    stray,
    workers_rules,
    world,
)
from tests.waiting import wait_for
from tests.workers.conftest import ADMIN
from tests.workers.members import ledger
from workers.fence import CENTRE_LEASE, NAMESPACE

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


@pytest.fixture(scope="module")
def member_world(database_url: str, redis_url: str, _session_engine: sa.Engine) -> Iterator[World]:
    with world(database_url, redis_url, _session_engine) as built:
        yield built


# -- the manifests ------------------------------------------------------------------------


def test_the_member_base_holds_the_workers_identity_and_a_long_lived_token() -> None:
    objects = rendered()
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert ("Namespace", ACCOUNT[0]) in by_kind
    account = by_kind[("ServiceAccount", ACCOUNT[1])]
    assert account["metadata"]["namespace"] == ACCOUNT[0]
    (token,) = [o for o in objects if o.get("type") == "kubernetes.io/service-account-token"]
    assert token["metadata"]["namespace"] == ACCOUNT[0]
    assert token["metadata"]["annotations"]["kubernetes.io/service-account.name"] == ACCOUNT[1]
    # The fence agent comes along, with its own identity and rules.
    assert ("Deployment", "quartermaster-fence-agent") in by_kind
    every = [
        (grant["apiGroups"][0], grant["resources"][0], grant["verbs"][0])
        for grant in grants(workers_rules(objects))
    ]
    assert every and len(every) == len(set(every)), "a grant given twice"
    assert all("*" not in (g, r, v) for g, r, v in every)


# -- the whole road, with exactly these rules ----------------------------------------------


def _deactivate_member_workload(w: World, job: str) -> None:
    """The member's operator deactivates the Kueue Workload of ``job``: the
    member's Kueue evicts the gang."""
    with w.admin() as api:
        custom: Any = kubernetes.client.CustomObjectsApi(api)
        items = custom.list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", "team-a", "workloads"
        )["items"]
        (mine,) = [
            o
            for o in items
            if any(ref.get("name") == job for ref in o["metadata"].get("ownerReferences") or ())
        ]
        custom.patch_namespaced_custom_object(
            "kueue.x-k8s.io",
            "v1beta2",
            "team-a",
            "workloads",
            mine["metadata"]["name"],
            {"spec": {"active": False}},
            _content_type="application/merge-patch+json",
        )


def test_the_workers_run_the_whole_road_with_exactly_the_rules_of_deploy_member(
    member_world: World,
) -> None:
    w = member_world
    # The audit covers everything since the member was registered (its
    # first heartbeat created the Lease), or since a case below gave back the
    # grant it took: worksteal may hand this process the cases first.
    # Dispatch: a gang runs and finishes; its job and the queue mirror go.
    first = w.submit(gang("Job", "first", "10s"))
    wait_for(lambda: w.state(first) == "Finished", 60, "first Finished")
    w.settle()
    # Every job kind, 4 GPUs each (24 of 32); then a gang of higher priority
    # that needs the whole member preempts them all.
    victims = [w.submit(gang(kind, f"low-{kind.lower()}", "100000s", 4)) for kind in JOB_KINDS]
    wait_for(lambda: {w.state(k) for k in victims} == {"Running"}, 90, "every kind Running")
    big = gang("Job", "big", "100000s", priority_class="urgent")
    big["spec"]["podSets"][0]["count"] = 4
    preemptor = w.submit(big)
    wait_for(lambda: w.state(preemptor) == "Running", 120, "the preemptor Running")
    assert {w.state(key) for key in victims} == {"Pending"}
    preempted = ledger(w.engine, "workload.preempted")
    assert sorted(p["workload"] for p in preempted) == sorted(name for _, name in victims)
    # Eviction: the member's Kueue evicts the preemptor; the centre hears it,
    # removes its job and requeues it whole.
    _deactivate_member_workload(w, "big")
    wait_for(lambda: ledger(w.engine, "workload.evicted"), 60, "the eviction recorded")
    assert ledger(w.engine, "workload.evicted")[0]["reason"] == "Deactivated"
    wait_for(lambda: w.state(preemptor) == "Running", 120, "the preemptor running again")
    for key in [preemptor, *victims]:
        w.services.submissions.cancel(ADMIN, *key)
    w.settle()
    # Serving: one replica of every serving kind runs, scales up and down in
    # place (the scale subresource), and is cancelled.
    served = [w.submit(serving(kind, f"serve-{kind.lower()}")) for kind in SERVING_KINDS]
    wait_for(lambda: {w.state(k) for k in served} == {"Running"}, 90, "every serving kind Running")
    for replicas in (2, 1):
        for key in served:
            w.services.submissions.scale(ADMIN, *key, {"spec": {"replicas": replicas}})
        wait_for(
            lambda r=replicas: all(w.replicas_here(k) == r for k in served),
            90,
            f"every serving kind at {replicas} on the member",
        )
    for key in served:
        w.services.submissions.cancel(ADMIN, *key)
    # Garbage collection of leftover jobs: one stray of every kind.
    for kind in RUN_KINDS:
        w.create(stray(kind, f"stray-{kind.lower()}"))
    w.settle()
    # A watch is audited when it ends: end the open ones (as the API server
    # does at its timeout), and see them start again.
    w.rewatch()

    def watched() -> bool:
        return {r.resource for r in w.audit() if r.verb == "watch"} >= {"nodes", "workloads"}

    wait_for(watched, 60, "the watches audited")
    # Deletion of the Cluster: its collection sweeps the member.
    w.delete_cluster()
    wait_for(
        lambda: (w.cluster().status.get("collection") or {}).get("state") == "Collected",
        120,
        "the Cluster collected",
    )
    assert w.ours() == []
    refused = [r for r in w.audit(w.granted_at) if r.denied]
    assert refused == [], f"refused: {refused}"
    unused = w.member.run(w.member.cluster.auth.unused_rules, WORKERS)
    assert unused == [], f"granted, never used: {unused}"
    w.registered()  # for the cases below
    w.settle()


# -- each grant, taken away ----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A grant, what needs it, and how a case makes that happen."""

    group: str
    resource: str
    verb: str
    operation: str
    #: none (it happens on every pass), rewatch, new-namespace, lease-gone,
    #: dispatch:<Kind>, finish:<Kind> (dispatched, run, removed),
    #: cancel:<Kind> (dispatched, running, cancelled), stray:<Kind>.
    trigger: str

    @property
    def id(self) -> str:
        return f"{self.verb}-{self.resource}"


def _case(group: str, resource: str, verb: str) -> Case:
    job = {plural: kind for kind, (_, plural) in JOB_KINDS.items()}
    serving = {plural: kind for kind, (_, plural) in SERVING_KINDS.items()}
    queue = {plural: kind for kind, plural in QUEUE_KINDS.items()}
    fixed: dict[tuple[str, str], tuple[str, str]] = {
        ("nodes", "list"): ("sync lists the Nodes", "none"),
        ("nodes", "watch"): ("the fleet loop watches the Nodes", "rewatch"),
        ("pods", "list"): ("sync lists the pods others run", "none"),
        ("pods", "patch"): ("reconcile lets a cancelled gang's pods go", "cancel:Job"),
        ("namespaces", "list"): ("reconcile lists our Namespaces", "none"),
        ("namespaces", "create"): ("reconcile creates a team's Namespace", "new-namespace"),
        ("namespaces", "patch"): ("reconcile applies a team's Namespace", "new-namespace"),
        ("workloads", "list"): ("sync lists the member's Kueue Workloads", "none"),
        ("workloads", "watch"): ("the fleet loop watches the Kueue Workloads", "rewatch"),
        ("leases", "get"): ("sync reads the fence agent's Lease", "none"),
        ("leases", "patch"): ("sync renews the centre's heartbeat Lease", "none"),
        ("leases", "create"): ("sync creates the centre's heartbeat Lease", "lease-gone"),
    }
    if (resource, verb) in fixed:
        operation, trigger = fixed[(resource, verb)]
    elif resource in queue:
        what = {
            "list": ("reconcile lists the member's", "none"),
            "create": ("dispatch creates the mirror's", "dispatch:Job"),
            "patch": ("dispatch applies the mirror's", "dispatch:Job"),
            "delete": ("reconcile removes the unused", "finish:Job"),
        }[verb]
        operation, trigger = f"{what[0]} {queue[resource]}", what[1]
    elif resource.removesuffix("/scale") in serving and resource.endswith("/scale"):
        kind = serving[resource.removesuffix("/scale")]
        operation, trigger = f"reconcile scales a {kind} in place", f"scale:{kind}"
    elif resource in serving:
        kind = serving[resource]
        operation, trigger = {
            "list": (f"reconcile lists the {kind}s", "none"),
            "create": (f"dispatch creates a {kind}", f"dispatch:{kind}"),
            "patch": (f"dispatch applies a {kind}", f"dispatch:{kind}"),
            "deletecollection": (f"a cancelled {kind} is removed by label", f"cancel:{kind}"),
            "delete": (f"a stray {kind} is removed by name", f"stray:{kind}"),
            "get": (f"reconcile waits for a removed {kind} to be gone", f"stray:{kind}"),
        }[verb]
    elif resource in job:
        kind = job[resource]
        # A RayCluster never finishes of itself: it is removed once cancelled.
        ended = f"cancel:{kind}" if kind == "RayCluster" else f"finish:{kind}"
        operation, trigger = {
            "list": (f"reconcile lists the {kind}s", "none"),
            "create": (f"dispatch creates a {kind}", f"dispatch:{kind}"),
            "patch": (f"dispatch applies a {kind}", f"dispatch:{kind}"),
            "deletecollection": (f"an ended {kind} is removed by label", ended),
            "delete": (f"a stray {kind} is removed by name", f"stray:{kind}"),
            "get": (f"reconcile waits for a removed {kind} to be gone", f"stray:{kind}"),
        }[verb]
    else:
        operation, trigger = "nothing the workers are known to do", "unknown"
    return Case(group, resource, verb, operation, trigger)


def _cases() -> list[Case]:
    if shutil.which("kubectl") is None:
        return []
    rules = workers_rules(rendered())
    return [_case(g["apiGroups"][0], g["resources"][0], g["verbs"][0]) for g in grants(rules)]


CASES = _cases()


def _without(rules: list[dict[str, Any]], case: Case) -> list[dict[str, Any]]:
    return [
        g
        for g in grants(rules)
        if (g["apiGroups"][0], g["resources"][0], g["verbs"][0])
        != (case.group, case.resource, case.verb)
    ]


def _trigger(w: World, case: Case) -> Callable[[], bool]:
    """Make the operation happen; returns whether what it would have done is
    still undone (checked once it was refused)."""
    what, _, kind = case.trigger.partition(":")
    if what in ("none", "rewatch"):
        if what == "rewatch":
            w.rewatch()
        return lambda: True
    if what == "lease-gone":
        w.drop_centre_lease()
        return lambda: w.get("Lease", CENTRE_LEASE, NAMESPACE) is None
    if what == "new-namespace":
        namespace = w.new_namespace()
        fresh = w.submit(gang("Job", w.name("ns"), "10s"), namespace)
        return lambda: w.get("Namespace", namespace) is None and w.job_of(fresh) is None
    if what == "stray":
        name = w.name(f"stray-{kind.lower()}")
        w.create(stray(kind, name))
        if case.verb == "delete":
            return lambda: w.get(kind, name, "team-a") is not None
        return lambda: True  # removed, but the pass that waits for it failed
    if what in ("cancel", "scale"):
        name = w.name(kind.lower())
        body = serving(kind, name) if kind in SERVING_KINDS else gang(kind, name, "100000s")
        running = w.submit(body)
        wait_for(lambda: w.state(running) == "Running", 60, f"{running} Running")
        if what == "scale":
            w.services.submissions.scale(ADMIN, *running, {"spec": {"replicas": 2}})
            return lambda: w.replicas_here(running) == 1
        w.services.submissions.cancel(ADMIN, *running)
        return lambda: w.state(running) != "Cancelled"
    name = w.name(kind.lower())
    key = w.submit(serving(kind, name) if kind in SERVING_KINDS else gang(kind, name, "10s"))
    if what == "dispatch":
        return lambda: w.job_of(key) is None
    queue = {plural: kind for kind, plural in QUEUE_KINDS.items()}.get(case.resource)
    if queue is None:  # the job finished, and is still there
        return lambda: w.job_of(key) is not None
    return lambda: any(o.startswith(f"{queue} ") for o in w.ours())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_taking_a_grant_away_refuses_the_operation_that_needs_it(
    member_world: World, case: Case
) -> None:
    assert case.trigger != "unknown", f"no case for {case.verb} {case.resource}: add one"
    w = member_world
    w.registered()
    w.settle()
    since = w.mark()
    w.grant(_without(w.rules, case))
    try:
        undone = _trigger(w, case)

        def refusals() -> list[tuple[str, str, str]]:
            return [
                (r.verb, r.group, f"{r.resource}/{r.subresource}" if r.subresource else r.resource)
                for r in w.audit(since)
                if r.denied
            ]

        wait_for(refusals, 90, f"{case.operation}: a 403", seen=w.active)
        assert set(refusals()) == {(case.verb, case.group, case.resource)}, case.operation
        assert undone(), f"{case.operation} happened without {case.verb} {case.resource}"
    finally:
        w.grant()
    if case.trigger.partition(":")[2] in _UNENDING:
        _cancel_unending(w)
    w.settle()  # and with the grant back, it goes through


#: What runs until cancelled: a RayCluster, and every serving kind.
_UNENDING = frozenset({"RayCluster", *SERVING_KINDS})


def _cancel_unending(w: World) -> None:
    """What runs until cancelled: once it runs (with the grant back), it is."""
    prefixes = tuple(f"{kind.lower()}-" for kind in _UNENDING)
    for line in w.active():
        key, _, state = line.partition(" ")
        namespace, _, name = key.partition("/")
        if name.startswith(prefixes) and state != "Cancelling":
            wait_for(lambda k=(namespace, name): w.state(k) == "Running", 90, f"{key} Running")
            w.services.submissions.cancel(ADMIN, namespace, name)


def test_every_grant_of_the_role_has_its_case() -> None:
    rules = workers_rules(rendered())
    assert len(CASES) == len(grants(rules)) and CASES, "every grant is a case above"
    unknown = [c.id for c in CASES if c.trigger == "unknown"]
    assert unknown == [], f"grants the workers are not known to use: {unknown}"
    assert {c.resource for c in CASES} >= {"nodes", "pods", "namespaces", "workloads", "leases"}
    assert {c.resource for c in CASES} >= set(QUEUE_KINDS.values())
    assert {c.resource for c in CASES} >= {p for _, p in RUN_KINDS.values()}
    assert {c.resource for c in CASES} >= {f"{p}/scale" for _, p in SERVING_KINDS.values()}
