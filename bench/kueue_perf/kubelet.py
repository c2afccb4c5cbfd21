"""``--stand-ins api``: the members run their API servers only and this plays
their kubelet, as bench/e2e.py does — each Job marked Complete its
workload's runtime after it appeared on the member.

Why there is such a mode: with their controllers (scheduler, kubelet, Job
controller, Kueue-like admission) the stand-ins spend most of their CPU
validating Kueue status writes against the CRDs' schemas and CEL rules
(profile in bench/results/kueue_perf.json), which on a 2-core box held the
baseline to about one workload a second: a cost of the simulator, which a
member running Kueue in Go pays at a fraction of it, not of Quartermaster.
The job's runtime then counts from its creation on the member (Kueue's
runner counts from admission; here admission is the centre's, and the job
reaches the member after it).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from pathlib import Path

from bench.e2e import Completer
from tests.workers.chaos.members import Member
from tests.workers.stack import JobRecord, MemberWatch


class RuntimeCompleter(Completer):
    """bench/e2e.py's Completer, each job after its own workload's runtime
    (the member job is named as its workload, in its namespace)."""

    def __init__(
        self, kubeconfig: Path, cluster: str, runtimes: Mapping[str, float], threads: int = 4
    ) -> None:
        super().__init__(kubeconfig, [cluster], 0.0, threads)
        self.runtimes = runtimes

    def add(self, job: JobRecord) -> None:
        after = self.runtimes.get(f"{job.namespace}/{job.name}", 0.0)
        with self.lock:
            heapq.heappush(self.heap, (job.created + after, job.cluster, job.namespace, job.name))
            self.lock.notify()


class Kubelets:
    """A watch and a completer per member; ``jobs()`` is every job seen."""

    def __init__(
        self, members: Iterable[Member], runtimes: Mapping[str, float], exits: ExitStack
    ) -> None:
        self.watches: list[MemberWatch] = []
        self.completers: list[RuntimeCompleter] = []
        for member in members:
            completer = RuntimeCompleter(member.kubeconfig, member.name, runtimes)
            exits.callback(completer.close)
            watch = exits.enter_context(MemberWatch([member.stand_in], member.kubeconfig))
            watch.on_job = completer.add
            self.watches.append(watch)
            self.completers.append(completer)

    def jobs(self) -> list[JobRecord]:
        out: list[JobRecord] = []
        for watch in self.watches:
            with watch.lock:
                out += list(watch.job_history)
        return out

    def counts(self) -> dict[str, int]:
        return {
            "completed": sum(c.completed for c in self.completers),
            "failed": sum(c.failed for c in self.completers),
        }
