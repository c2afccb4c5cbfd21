"""A Hypothesis state machine over mixed training and serving, scalings and reclaims.

Training gangs and serving workloads (one-GPU replicas, and LeaderWorkerSet
groups of a leader and a worker that must share an island) are submitted,
serving workloads are scaled up and down (units added or removed, newest
index first), training gangs finish, and training quotas grow and shrink so
that training reclaims what serving borrowed. After every rule a cycle runs
and must be deterministic and keep every check of
:mod:`tests.engine.invariants` (DESIGN.md's invariants, a group in one
island, and an accelerator island holding one class); besides, no
preemption takes a serving workload below its ``minReplicas``, and the
units it loses are its newest (docs/serving.md).
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from service.domain.inventory import Cluster, Node
from service.domain.quota import (
    ClusterQueue,
    Cohort,
    FlavorQuotas,
    LocalQueue,
    PreemptionPolicy,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Topology,
)
from service.domain.workload import AdmittedWorkload, PodSet, TopologyRequest, Workload
from service.engine import Snapshot, admission_cycle
from tests.engine.invariants import violations

GPU = "nvidia.com/gpu"
ISLAND = "example.com/block"
TRAINING = ("train-a", "train-b")
SERVE = "serve"
FLAVOR = ResourceFlavor("gpu", topology_name="fabric")
TOPOLOGY = Topology("fabric", (ISLAND,))
CLUSTERS = ("c0", "c1")


def nodes() -> list[Node]:
    """2 clusters x 3 islands x 2 nodes x 8 GPUs."""
    return [
        Node(
            name=f"{c}-i{i}-n{k}",
            cluster=c,
            flavor="gpu",
            island=f"{c}-i{i}",
            allocatable={GPU: 8},
            labels={ISLAND: f"{c}-i{i}"},
        )
        for c in CLUSTERS
        for i in range(3)
        for k in range(2)
    ]


def cluster_queue(name: str, nominal: int) -> ClusterQueue:
    group = ResourceGroup((GPU,), (FlavorQuotas("gpu", {GPU: ResourceQuota(nominal)}),))
    return ClusterQueue(
        name=name,
        resource_groups=(group,),
        cohort_name="all",
        preemption=PreemptionPolicy(
            within_cluster_queue="LowerPriority", reclaim_within_cohort="Any"
        ),
        workload_class="inference" if name == SERVE else "training",
    )


def _age(admitted: AdmittedWorkload) -> tuple[float, int]:
    return admitted.admitted_at, admitted.workload.replica or 0


class ServingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.serial = 0
        self.quotas = {"train-a": 16, "train-b": 16, SERVE: 16}
        self.pending: dict[str, Workload] = {}
        self.running: dict[str, AdmittedWorkload] = {}
        #: Serving workload key -> (its unit template, replicas wanted).
        self.serving: dict[str, tuple[Workload, int]] = {}
        self.nodes = tuple(nodes())

    def snapshot(self) -> Snapshot:
        return Snapshot(
            cluster_queues=tuple(cluster_queue(n, q) for n, q in sorted(self.quotas.items())),
            resource_flavors=(FLAVOR,),
            cohorts=(Cohort("all"),),
            local_queues=tuple(LocalQueue(t, "q", t) for t in (*TRAINING, SERVE)),
            topologies=(TOPOLOGY,),
            clusters=tuple(Cluster(c) for c in CLUSTERS),
            nodes=self.nodes,
            admitted=tuple(self.running[k] for k in sorted(self.running)),
            pending=tuple(self.pending[k] for k in sorted(self.pending)),
            namespaces={t: {} for t in (*TRAINING, SERVE)},
        )

    def cycle(self) -> None:
        snapshot = self.snapshot()
        result = admission_cycle(snapshot, self.now)
        assert admission_cycle(snapshot, self.now) == result, "not deterministic"
        problems = violations(snapshot, result, self.now)
        assert not problems, problems
        self._floor_and_order(result.preemptions)
        for preemption in result.preemptions:
            victim = self.running.pop(preemption.workload)
            self.pending[victim.workload.key] = dataclasses.replace(
                victim.workload, queued_at=self.now
            )
        for decision in result.admissions:
            wl = self.pending.pop(decision.workload)
            self.running[wl.key] = AdmittedWorkload(wl, decision.admission, admitted_at=self.now)

    def _floor_and_order(self, preemptions: object) -> None:
        victims: dict[str, set[str]] = {}
        for preemption in preemptions:  # type: ignore[attr-defined]
            wl = self.running[preemption.workload].workload
            if wl.replica_of is not None:
                victims.setdefault(wl.replica_of, set()).add(wl.key)
        for parent, keys in victims.items():
            units = sorted(
                (a for a in self.running.values() if a.workload.replica_of == parent),
                key=_age,
                reverse=True,
            )
            floor = units[0].workload.min_replicas
            assert len(units) - len(keys) >= floor, (parent, len(units), keys, floor)
            newest = {a.workload.key for a in units[: len(keys)]}
            assert keys == newest, (parent, sorted(keys), sorted(newest))

    # --- rules ----------------------------------------------------------------------------

    @rule(
        team=st.sampled_from(TRAINING),
        gpus=st.sampled_from((1, 4, 8, 16, 32)),
        priority=st.sampled_from((0, 100)),
    )
    def submit_training(self, team: str, gpus: int, priority: int) -> None:
        per_pod = min(gpus, 8)
        pods = gpus // per_pod
        topology = TopologyRequest("required") if pods > 1 else None
        name = f"t{self.serial}"
        self.serial += 1
        self.pending[f"{team}/{name}"] = Workload(
            namespace=team,
            name=name,
            queue_name="q",
            pod_sets=(PodSet("main", pods, {GPU: per_pod}, topology_request=topology),),
            creation_time=self.now,
            priority=priority,
        )
        self.cycle()

    @rule(
        replicas=st.integers(1, 4),
        floor=st.integers(0, 3),
        group=st.booleans(),
        priority=st.sampled_from((0, 100)),
    )
    def submit_serving(self, replicas: int, floor: int, group: bool, priority: int) -> None:
        if group:
            together = TopologyRequest("required", group="group")
            pod_sets = (
                PodSet("leader", 1, {GPU: 4}, topology_request=together),
                PodSet("worker", 1, {GPU: 8}, topology_request=together),
            )
        else:
            pod_sets = (PodSet("main", 1, {GPU: 1}),)
        name = f"s{self.serial}"
        self.serial += 1
        unit = Workload(
            namespace=SERVE,
            name=name,
            queue_name="q",
            pod_sets=pod_sets,
            creation_time=self.now,
            priority=priority,
            workload_class="inference",
            replica=0,
            min_replicas=min(floor, replicas),
        )
        self.serving[f"{SERVE}/{name}"] = (unit, 0)
        self._scale_to(f"{SERVE}/{name}", replicas)
        self.cycle()

    def _scale_to(self, parent: str, replicas: int) -> None:
        unit, before = self.serving[parent]
        for index in range(before, replicas):
            wl = dataclasses.replace(unit, replica=index, creation_time=self.now)
            self.pending[wl.key] = wl
        for index in range(replicas, before):
            key = f"{parent}#{index}"
            self.pending.pop(key, None)
            self.running.pop(key, None)
        self.serving[parent] = (unit, replicas)

    @precondition(lambda self: bool(self.serving))
    @rule(data=st.data(), replicas=st.integers(0, 5))
    def scale(self, data: st.DataObject, replicas: int) -> None:
        parent = data.draw(st.sampled_from(sorted(self.serving)))
        self._scale_to(parent, replicas)
        self.cycle()

    @precondition(lambda self: any(k.split("/")[0] in TRAINING for k in self.running))
    @rule(data=st.data())
    def finish_training(self, data: st.DataObject) -> None:
        keys = sorted(k for k in self.running if k.split("/")[0] in TRAINING)
        del self.running[data.draw(st.sampled_from(keys))]
        self.cycle()

    @rule(queue=st.sampled_from((*TRAINING, SERVE)), nominal=st.sampled_from((0, 16, 32, 64)))
    def change_quota(self, queue: str, nominal: int) -> None:
        """Training quota up: a reclaim of what serving borrowed; down: serving may borrow."""
        self.quotas[queue] = nominal
        self.cycle()

    @rule(seconds=st.sampled_from((1.0, 600.0)))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.cycle()


ServingMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestServingMachine = ServingMachine.TestCase
