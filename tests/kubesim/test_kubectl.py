"""``kubectl`` against the stand-in: apply, get, describe, delete and get --watch."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time

from sim.kubesim.testing import RunningCluster
from tests.kubesim.conftest import Kubectl
from tests.waiting import wait_for

DOCS_SETUP = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: "default-flavor"
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: "cluster-queue"
spec:
  namespaceSelector: {} # match all.
  resourceGroups:
  - coveredResources: ["cpu", "memory"]
    flavors:
    - name: "default-flavor"
      resources:
      - name: "cpu"
        nominalQuota: 9
      - name: "memory"
        nominalQuota: 36Gi
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  namespace: "default"
  name: "user-queue"
spec:
  clusterQueue: "cluster-queue"
"""

BORROWING_WITHOUT_COHORT = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: no-cohort
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: ["cpu"]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: 9, borrowingLimit: 1}
"""

UNKNOWN_FIELD = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: typo
spec:
  namespaceSelector: {}
  resourceGroup: []
"""

JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: vision
  labels: {{kueue.x-k8s.io/queue-name: default}}
  annotations: {{quartermaster.dev/sim-duration: {duration}}}
spec:
  parallelism: 2
  completions: 2
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: train
        image: registry.example/train:1
        resources:
          requests: {{nvidia.com/gpu: "8", cpu: "4", memory: 16Gi}}
"""


def test_apply_the_kueue_documentation_setup_twice(kubectl: Kubectl) -> None:
    first = kubectl("apply", "-f", "-", stdin=DOCS_SETUP).stdout.splitlines()
    assert first == [
        "resourceflavor.kueue.x-k8s.io/default-flavor created",
        "clusterqueue.kueue.x-k8s.io/cluster-queue created",
        "localqueue.kueue.x-k8s.io/user-queue created",
    ]
    again = kubectl("apply", "-f", "-", stdin=DOCS_SETUP).stdout.splitlines()
    assert all(line.endswith(" unchanged") for line in again) and len(again) == 3
    queues = json.loads(kubectl("get", "clusterqueues", "-o", "json").stdout)
    assert "cluster-queue" in {item["metadata"]["name"] for item in queues["items"]}
    described = kubectl("describe", "clusterqueue", "cluster-queue").stdout
    assert "Nominal Quota:  36Gi" in described
    table = kubectl("get", "localqueue", "user-queue", "-n", "default").stdout
    assert table.split()[:5] == ["NAME", "CLUSTERQUEUE", "PENDING", "WORKLOADS", "ADMITTED"]


def test_apply_reports_the_cel_rule_and_the_unknown_field(kubectl: Kubectl) -> None:
    invalid = kubectl("apply", "-f", "-", stdin=BORROWING_WITHOUT_COHORT, check=False)
    assert invalid.returncode != 0
    assert 'The ClusterQueue "no-cohort" is invalid' in invalid.stderr
    assert "borrowingLimit must be nil when cohort is empty" in invalid.stderr
    unknown = kubectl("apply", "-f", "-", stdin=UNKNOWN_FIELD, check=False)
    assert unknown.returncode != 0
    assert 'unknown field "spec.resourceGroup"' in unknown.stderr
    server_side = kubectl("apply", "--server-side", "-f", "-", stdin=UNKNOWN_FIELD, check=False)
    assert ".spec.resourceGroup: field not declared in schema" in server_side.stderr
    missing = kubectl("get", "clusterqueue", "typo", check=False)
    assert 'clusterqueues.kueue.x-k8s.io "typo" not found' in missing.stderr


def test_get_nodes_with_selectors_and_wide_output(kubectl: Kubectl) -> None:
    names = kubectl(
        "get", "nodes", "-l", "example.com/fabric-block=east-1-h100-i1", "-o", "name"
    ).stdout.split()
    assert names == [f"node/east-1-h100-i1-n{k}" for k in range(4)]
    wide = kubectl("get", "nodes", "east-1-a100-i0-n0", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[:5] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert wide[1].split()[1] == "Ready"


def test_cordon_and_uncordon(kubectl: Kubectl) -> None:
    node = "east-1-a100-i0-n3"
    assert kubectl("cordon", node).stdout.strip() == f"node/{node} cordoned"
    assert kubectl("get", "node", node).stdout.split()[6] == "Ready,SchedulingDisabled"
    assert kubectl("uncordon", node).stdout.strip() == f"node/{node} uncordoned"
    spec = json.loads(kubectl("get", "node", node, "-o", "json").stdout)["spec"]
    assert not spec.get("unschedulable")


def test_job_lifecycle_with_get_watch_describe_and_delete(
    kubectl: Kubectl, sim: RunningCluster
) -> None:
    watching = sim.run(lambda: len(sim.cluster.watchers))
    watcher = subprocess.Popen(
        [kubectl.binary, "get", "jobs", "-n", "vision", "--watch", "--output-watch-events"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kubectl.env,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert watcher.stdout is not None
        for line in watcher.stdout:
            lines.put(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        # Create only once kubectl's watch is open, so that it sees the Job from the start.
        wait_for(lambda: sim.run(lambda: len(sim.cluster.watchers)) > watching)
        created = kubectl("apply", "-f", "-", stdin=JOB.format(name="train", duration="100s"))
        assert created.stdout.strip() == "job.batch/train created"
        seen: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                continue
            if "Complete" in seen[-1]:
                break
        events = [line.split() for line in seen if line.split()[1:2] == ["train"]]
        assert events[0][:3] == ["ADDED", "train", "Suspended"]
        assert any(e[0] == "MODIFIED" and e[2] == "Running" for e in events)
        assert events[-1][:4] == ["MODIFIED", "train", "Complete", "2/2"]
    finally:
        watcher.terminate()
        watcher.wait(timeout=10)
        assert watcher.stdout is not None and watcher.stderr is not None
        watcher.stdout.close()
        watcher.stderr.close()
        reader.join(timeout=5)

    described = kubectl("describe", "job", "train", "-n", "vision").stdout
    assert "Pods Statuses:    0 Active (0 Ready) / 2 Succeeded / 0 Failed" in described
    for reason in ("Suspended", "CreatedWorkload", "Resumed", "Completed"):
        assert reason in described
    workloads = kubectl("get", "workloads", "-n", "vision", "-o", "json").stdout
    workload = next(
        item
        for item in json.loads(workloads)["items"]
        if item["metadata"]["ownerReferences"][0]["name"] == "train"
    )
    described = kubectl("describe", "workload", workload["metadata"]["name"], "-n", "vision")
    assert "Admitted by ClusterQueue vision" in described.stdout

    deleted = kubectl("delete", "-f", "-", stdin=JOB.format(name="train", duration="100s"))
    # A newer kubectl (1.37, as .ci/run installs where none is) names the namespace.
    assert deleted.stdout.strip() in (
        'job.batch "train" deleted',
        'job.batch "train" deleted from vision namespace',
    )
    gone = kubectl("get", "job", "train", "-n", "vision", check=False)
    assert gone.returncode != 0 and 'jobs.batch "train" not found' in gone.stderr
    # The Workload goes with its owner (garbage collection).
    wait_for(
        lambda: (
            sim.get("kueue.x-k8s.io/v1beta2", "Workload", "vision", workload["metadata"]["name"])
            is None
        )
    )
