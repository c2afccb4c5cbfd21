"""qmctl as a subprocess against the live API: apply of a multi-document
Kueue fleet, get in every output, describe, explain, submit (with and without
--wait), cancel, delete, and contexts in a config file of its own."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from quartermaster_client import Client, Outcome, Workload, outcome
from quartermaster_client.cli import app
from quartermaster_client.cli.shared import EXIT_CODES
from quartermaster_client.config import ConfigFile
from quartermaster_client.volcano import QueueRefused
from typer.testing import CliRunner

from service.app.bootstrap import Services
from tests.api.conftest import ADMIN_TOKEN
from tests.clients.conftest import gpu_pod, job, setup_quota, workload
from tests.floor import test_workload_kinds as kinds

QMCTL = [sys.executable, "-m", "quartermaster_client.cli"]

FLEET = """\
# A Kueue fleet as exported from a cluster: server-set metadata, a Kueue-only
# field, and the LocalQueue before the ClusterQueue it names.
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: train
  namespace: team-a
spec:
  clusterQueue: team-a
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: team-a
spec:
  cohortName: research
  admissionChecksStrategy:
    admissionChecks: []
  resourceGroups:
  - coveredResources: [cpu, memory, nvidia.com/gpu]
    flavors:
    - name: h100
      resources:
      - {name: cpu, nominalQuota: 512}
      - {name: memory, nominalQuota: 4Ti}
      - {name: nvidia.com/gpu, nominalQuota: 64, borrowingLimit: 16}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: h100
  uid: 0f8e2a8c-0000-4000-8000-000000000000
  resourceVersion: "982734"
  creationTimestamp: "2025-01-01T00:00:00Z"
  managedFields: [{manager: kubectl}]
spec:
  nodeLabels: {sku: h100}
  topologyName: fabric
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: Topology
metadata:
  name: fabric
spec:
  levels:
  - nodeLabel: example.com/fabric-block
  - nodeLabel: kubernetes.io/hostname
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: Cohort
metadata:
  name: research
spec: {}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata:
  name: urgent
value: 1000
description: deadlines
"""

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def qmctl(tmp_path: Path, api_url: str, qm: Client) -> Iterator[Run]:
    """qmctl with a contexts file in tmp_path whose current context is the
    live API as admin, namespace team-a: written by the client's own
    ConfigFile, as ``qmctl config set-context`` writes it (which
    test_contexts_in_a_config_file runs), without a process of its own."""
    path = tmp_path / "qmctl" / "config"
    env = {"QMCTL_CONFIG": str(path), "PATH": "/usr/bin:/bin"}

    def run(*args: str, stdin: str | None = None, code: int | None = 0) -> Any:
        done = subprocess.run(
            [*QMCTL, *args],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            input=stdin,
            timeout=60,
        )
        if code is not None:
            assert done.returncode == code, (args, done.stdout, done.stderr)
        return done

    config = ConfigFile.load(path)
    config.set_context("live", api_url, ADMIN_TOKEN, "team-a")
    config.save()
    yield run


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_apply_a_kueue_fleet_then_get_in_every_output(qmctl: Run, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    applied = qmctl("apply", "-f", str(fleet))
    assert _lines(applied.stdout) == [
        "topology/fabric created",
        "resourceflavor/h100 created",
        "cohort/research created",
        "clusterqueue/team-a created",
        "localqueue/train created in namespace team-a",
        "workloadpriorityclass/urgent created",
    ]
    assert "admissionChecksStrategy has no Quartermaster meaning" in applied.stderr
    again = qmctl("apply", "-f", "-", stdin=FLEET)
    assert all(line.split()[1] == "unchanged" for line in _lines(again.stdout))
    changed = qmctl("apply", "-f", "-", stdin=FLEET.replace("nominalQuota: 64", "nominalQuota: 96"))
    assert "clusterqueue/team-a configured" in changed.stdout
    assert changed.stdout.count("configured") == 1

    as_json = json.loads(qmctl("get", "clusterqueues", "-o", "json").stdout)
    assert as_json["kind"] == "ClusterQueueList"
    [cq] = as_json["items"]
    assert cq["apiVersion"] == "quartermaster.dev/v1"
    assert cq["spec"]["cohortName"] == "research"
    gpu = cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]
    assert (gpu["nominalQuota"], gpu["borrowingLimit"]) == (96, 16)
    flavor = yaml.safe_load(qmctl("get", "rf", "h100", "-o", "yaml").stdout)
    assert flavor["metadata"]["resourceVersion"] != "982734"
    assert flavor["spec"]["topologyName"] == "fabric"

    cq_table = _lines(qmctl("get", "cq").stdout)
    assert cq_table[0].split() == [
        "NAME",
        "COHORT",
        "PENDING",
        "ADMITTED",
        "GPU(USED/NOMINAL)",
        "BORROWED",
        "AGE",
    ]
    assert cq_table[1].split()[:6] == ["team-a", "research", "0", "0", "0/96", "0"]
    lq_table = _lines(qmctl("get", "localqueues", "-A").stdout)
    assert lq_table[1].split()[:3] == ["team-a", "train", "team-a"]
    names = _lines(qmctl("get", "topologies", "-o", "name").stdout)
    assert names == ["topology/fabric"]
    wpc = _lines(qmctl("get", "wpc").stdout)
    assert wpc[1].split()[:3] == ["urgent", "1000", "deadlines"]
    described = qmctl("describe", "cq", "team-a").stdout
    assert "Name:         team-a" in described and "Usage:        0/96 GPUs" in described

    deleted = qmctl("delete", "-f", str(fleet))
    assert _lines(deleted.stdout)[0] == "workloadpriorityclass/urgent deleted"
    assert "localqueue/train deleted in namespace team-a" in _lines(deleted.stdout)
    assert len(_lines(deleted.stdout)) == 6
    assert "No clusterqueues found" in qmctl("get", "cq").stderr


def test_submit_get_explain_cancel_and_wait(qmctl: Run, tmp_path: Path, qm: Client) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    qmctl("apply", "-f", str(fleet))
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job("train-1", parallelism=2)))
    submitted = qmctl("submit", "-f", str(manifest))
    assert submitted.stdout.strip() == (
        "workload/train-1 submitted to team-a (ClusterQueue team-a, Pending)"
    )
    qmctl("submit", "-f", "-", stdin=yaml.safe_dump(job("train-2", parallelism=4)))

    table = _lines(qmctl("get", "workloads").stdout)
    assert table[0].split() == ["NAME", "QUEUE", "STATE", "CLUSTER", "ISLAND", "GPUS", "AGE"]
    assert [row.split()[:6] for row in table[1:]] == [
        ["train-1", "train", "Pending", "-", "-", "4"],
        ["train-2", "train", "Pending", "-", "-", "8"],
    ]
    wide = _lines(qmctl("get", "wl", "-A", "-o", "wide").stdout)
    assert wide[0].split()[0] == "NAMESPACE" and "CLUSTERQUEUE" in wide[0]
    assert wide[1].split()[:2] == ["team-a", "train-1"]
    picked = json.loads(qmctl("get", "wl", "train-2", "-o", "json").stdout)
    assert picked["kind"] == "Workload" and picked["spec"]["podSets"][0]["count"] == 4

    explained = qmctl("explain", "train-2").stdout
    assert "Workload team-a/train-2 is Pending in LocalQueue train (ClusterQueue team-a)" in (
        explained
    )
    assert "It asks for 8 nvidia.com/gpu, 32 cpu, 256Gi memory in all." in explained
    assert "Position 2 of 2 pending in team-a." in explained
    assert "Waiting for the next admission cycle: no decision has been made yet." in explained
    assert "team-a uses 0 of 64 nominal GPUs; 2 pending, 0 admitted." in explained
    assert "Explain:" in qmctl("describe", "workload", "train-1").stdout

    timed_out = qmctl(
        "submit",
        "-f",
        "-",
        "--wait",
        "--timeout",
        "1s",
        "--poll",
        "0.2",
        code=5,
        stdin=yaml.safe_dump(job("train-3")),
    )
    assert "timed out" in timed_out.stderr

    # --wait ends with the workload: cancelled while waiting is exit code 6.
    fourth = tmp_path / "train-4.yaml"
    fourth.write_text(yaml.safe_dump(job("train-4")))
    waiting = subprocess.Popen(
        [*QMCTL, "submit", "-f", str(fourth), "--wait", "--timeout", "30s", "--poll", "0.3"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"QMCTL_CONFIG": str(tmp_path / "qmctl" / "config"), "PATH": "/usr/bin:/bin"},
    )
    _wait_until(lambda: _exists(qm, "train-4"))
    qm.cancel("train-4", namespace="team-a")
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 6, (out, err)
    assert "workload/train-4 Cancelled" in out

    assert _lines(qmctl("cancel", "train-1").stdout) == ["workload/train-1 cancelled"]
    assert _lines(qmctl("delete", "wl", "train-2", "train-3").stdout) == [
        "workload/train-2 cancelled in namespace team-a",
        "workload/train-3 cancelled in namespace team-a",
    ]
    pending = qmctl("get", "wl", "--field-selector", "status.state=Pending", "-o", "name")
    assert pending.stdout == ""


def test_wait_for_a_state_or_condition(qmctl: Run, tmp_path: Path, qm: Client) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    qmctl("apply", "-f", str(fleet))
    qmctl("submit", "-f", "-", stdin=yaml.safe_dump(job("train-5")))
    there = qmctl("wait", "train-5", "--for", "state=Admitted,Pending")
    assert _lines(there.stdout) == ["workload/train-5 Pending"]
    # No worker admits here: Running never comes.
    late = ["--timeout", "1s", "--poll", "0.2"]
    timed_out = qmctl("wait", "train-5", "--for", "state=Running", *late, code=5)
    assert "timed out: workload team-a/train-5 is still Pending" in timed_out.stderr
    qmctl("wait", "train-5", "--for", "condition=PodsReady", *late, code=5)
    qm.cancel("train-5", namespace="team-a")
    ended = qmctl("wait", "train-5", "--for", "state=Running", *late, code=6)
    assert "workload/train-5 Cancelled before state=Running" in ended.stderr
    bad = qmctl("wait", "train-5", "--for", "phase=Running", code=2)
    assert "Invalid value for --for: 'phase=Running' is not" in bad.stderr


def _exists(qm: Client, name: str) -> bool:
    return any(w.name == name for w in qm.workloads.list(namespace="team-a"))


def _wait_until(check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_errors_name_the_field_and_exit_1(qmctl: Run) -> None:
    bad = FLEET.split("---")[1].replace("cohortName: research", "cohortName: Research!")
    failed = qmctl("apply", "-f", "-", stdin=bad, code=1)
    assert "clusterqueue/team-a" in failed.stderr and "spec.cohortName" in failed.stderr
    missing = qmctl("get", "cq", "nope", code=1)
    assert 'error: 404 Not found: clusterqueues "nope" not found' in missing.stderr
    unknown = qmctl("get", "gpus", code=2)
    assert "unknown kind 'gpus'" in unknown.stderr
    no_context = qmctl("--context", "nowhere", "get", "cq", code=1)
    assert "no context 'nowhere'" in no_context.stderr


def test_a_422_says_each_message_once(qmctl: Run, qm: Client) -> None:
    """A problem's detail often repeats its field errors (a submission's
    lists them all): each is printed once, on its own line."""
    setup_quota(qm)
    bad = workload("bad")
    bad["spec"]["podSets"][0]["count"] = 0
    refused = qmctl("submit", "-f", "-", stdin=yaml.safe_dump(bad), code=1)
    assert refused.stderr.splitlines() == [
        "error: 422 Invalid object: the submission is invalid",
        "  spec.podSets[0].count: Input should be greater than or equal to 1",
    ]
    query = qmctl("ledger", "query", "--since", "yesterday", code=1).stderr.splitlines()
    assert query[0] == "error: 422 Invalid request" and query[1].startswith("  since: ")
    assert len(query) == 2


def test_get_w_points_to_watch(qmctl: Run) -> None:
    for args in (["get", "wl", "-w"], ["get", "-w"], ["get", "--watch", "cq", "-n", "team-a"]):
        done = qmctl(*args, code=2)
        assert "qmctl get does not watch; qmctl watch does: qmctl watch workloads" in done.stderr
    assert "qmctl watch workloads -n team-a" in qmctl("get", "--help").stdout


VOLCANO_QUEUE = """\
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata:
  name: default
spec:
  weight: 1
"""


def test_apply_takes_kinds_only_of_their_api_group(qmctl: Run, qm: Client) -> None:
    """A Volcano Queue is no LocalQueue, though `queue` is one's short name:
    one with no quota to map (weight alone) is refused naming the rule,
    without a request; Kueue's kinds that Quartermaster does not serve too;
    the rest of the file is applied."""
    check = "apiVersion: kueue.x-k8s.io/v1beta2\nkind: AdmissionCheck\nmetadata:\n  name: prov\n"
    cohort = FLEET.split("---")[4]
    applied = qmctl("apply", "-f", "-", stdin="---\n".join([VOLCANO_QUEUE, check, cohort]), code=1)
    assert _lines(applied.stdout) == ["cohort/research created"]
    errors = _lines(applied.stderr)
    assert errors[0].startswith(
        "error: queue/default (<stdin>#0): Volcano Queue default: spec.deserved: "
        "a Queue with neither deserved nor capability shares by weight alone"
    )
    assert (
        "error: admissioncheck/prov (<stdin>#1): apiVersion kueue.x-k8s.io/v1beta2 kind "
        in (errors[1])
    )
    assert list(qm.localqueues.list(all_namespaces=True)) == []
    assert list(qm.clusterqueues.list()) == []
    with pytest.raises(QueueRefused, match=r"spec\.deserved"):
        qm.apply(yaml.safe_load(VOLCANO_QUEUE), namespace="team-a")
    podgroup = VOLCANO_QUEUE.replace("kind: Queue", "kind: PodGroup")
    refused = qmctl("apply", "-f", "-", stdin=podgroup, code=1)
    assert "apiVersion scheduling.volcano.sh/v1beta1 kind PodGroup is not something" in (
        refused.stderr
    )
    refused = qmctl("get", "queues.scheduling.volcano.sh", code=2)
    assert "scheduling.volcano.sh is not an API group Quartermaster serves" in refused.stderr
    assert _lines(qmctl("get", "cohorts.kueue.x-k8s.io").stdout)[1].split()[0] == "research"
    assert "No localqueues found" in qmctl("get", "queue", "-A").stderr  # the short name still


VOLCANO_QUEUES = """\
apiVersion: kueue.x-k8s.io/v1beta2
kind: Cohort
metadata:
  name: research
spec: {}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata:
  name: team-v
  annotations: {quartermaster.dev/cohort: research}
spec:
  weight: 3
  reclaimable: false
  deserved: {cpu: 96, memory: 1Ti, nvidia.com/gpu: 8}
  capability: {cpu: 192, memory: 2Ti, nvidia.com/gpu: 16}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: h100
spec:
  nodeLabels: {sku: h100}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata:
  name: team-w
spec:
  deserved: {cpu: 8, nvidia.com/gpu: 8}
  capability: {cpu: 4, nvidia.com/gpu: 16}
"""


def test_apply_maps_a_volcano_queue_to_a_cluster_queue(qmctl: Run, qm: Client) -> None:
    """qmctl apply -f of Volcano Queues against the live API: one becomes
    the ClusterQueue of the rule (docs/volcano.md), of the only flavor,
    after the flavor and cohort of the same file; applied again it is
    unchanged; one Volcano's webhook would refuse is refused naming the
    field, and nothing is made of it."""
    applied = qmctl("apply", "-f", "-", stdin=VOLCANO_QUEUES, code=1)
    assert _lines(applied.stdout) == [
        "resourceflavor/h100 created",
        "cohort/research created",
        "clusterqueue/team-v created",
    ]
    # (beside the server's warning that no node carries the flavor's labels)
    assert [line for line in _lines(applied.stderr) if line.startswith("error")] == [
        "error: queue/team-w (<stdin>#3): Volcano Queue team-w: spec.deserved.cpu: "
        "must be <= capability (Volcano's rule) (docs/volcano.md)"
    ]
    spec = qm.clusterqueues.get("team-v").to_dict()["spec"]
    assert spec["cohortName"] == "research"
    assert spec["fairSharing"] == {"weight": 3}
    (group,) = spec["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    (flavor,) = group["flavors"]
    assert flavor["name"] == "h100"
    quotas = {r["name"]: r for r in flavor["resources"]}
    assert quotas["nvidia.com/gpu"] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": 8,
        "borrowingLimit": 8,
        "lendingLimit": 0,
    }
    assert (quotas["memory"]["nominalQuota"], quotas["memory"]["borrowingLimit"]) == ("1Ti", "1Ti")
    assert [q.name for q in qm.clusterqueues.list()] == ["team-v"]
    assert list(qm.localqueues.list(all_namespaces=True)) == []
    again = qmctl("apply", "-f", "-", stdin=VOLCANO_QUEUES.split("---")[1])
    assert _lines(again.stdout) == ["clusterqueue/team-v unchanged"]


VOLCANO_JOB = """\
# Volcano's example/integrations/mpi/mpi-example.yaml, its pods made to meet
# the security floor.
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: lm-mpi-job
  labels: {kueue.x-k8s.io/queue-name: train}
spec:
  minAvailable: 3
  schedulerName: volcano
  plugins: {ssh: [], svc: []}
  tasks:
  - replicas: 1
    name: mpimaster
    policies:
    - {event: TaskCompleted, action: CompleteJob}
    template: {template}
  - replicas: 2
    name: mpiworker
    template: {template}
"""


def test_submit_and_apply_take_a_volcano_job(qmctl: Run, qm: Client) -> None:
    """A Volcano Job is a job to submit (``qmctl submit`` and ``apply``),
    a pod set per task; a broken one is refused naming the field."""
    setup_quota(qm)
    template = json.dumps(gpu_pod(2))
    text = VOLCANO_JOB.replace("{template}", template)
    submitted = qmctl("submit", "-f", "-", stdin=text)
    assert submitted.stdout.strip() == (
        "workload/lm-mpi-job submitted to team-a (ClusterQueue cq-a, Pending)"
    )
    spec = qm.workloads.get("lm-mpi-job", "team-a").to_dict()["spec"]
    assert [(p["name"], p["count"]) for p in spec["podSets"]] == [
        ("mpimaster", 1),
        ("mpiworker", 2),
    ]
    again = qmctl("apply", "-f", "-", stdin=text.replace("lm-mpi-job", "lm-mpi-job-2"))
    assert _lines(again.stdout) == ["workload/lm-mpi-job-2 created in namespace team-a"]
    broken = text.replace("lm-mpi-job", "lm-mpi-job-3")
    broken = broken.replace("name: mpiworker", "name: mpimaster")
    refused = qmctl("submit", "-f", "-", stdin=broken, code=1)
    assert refused.stderr.splitlines() == [
        "error: 422 Invalid object: the submission is invalid",
        "  spec.tasks[1].name: duplicated task name mpimaster",
    ]


def test_contexts_in_a_config_file(qmctl: Run, tmp_path: Path, api_url: str) -> None:
    path = tmp_path / "qmctl" / "config"
    qmctl("config", "set-context", "prod", "--server", "https://qm.example", "--token", "t")
    listed = _lines(qmctl("config", "get-contexts").stdout)
    assert listed[0].split() == ["CURRENT", "NAME", "SERVER", "NAMESPACE"]
    assert listed[1].split() == ["*", "live", api_url, "team-a"]
    assert listed[2].split() == ["prod", "https://qm.example"]
    qmctl("config", "use-context", "prod")
    assert qmctl("config", "current-context").stdout.strip() == "prod"
    assert "bootstrap" in qmctl("--context", "live", "whoami").stdout
    qmctl("config", "use-context", "nope", code=1)
    qmctl("config", "set-context", "live", "--namespace", "team-b", "--use")
    document = yaml.safe_load(path.read_text())
    assert document["current-context"] == "live"
    assert document["contexts"][0]["context"] == {
        "server": api_url,
        "token": ADMIN_TOKEN,
        "namespace": "team-b",
    }
    assert path.stat().st_mode & 0o777 == 0o600
    qmctl("config", "delete-context", "prod")
    assert [c["name"] for c in yaml.safe_load(path.read_text())["contexts"]] == ["live"]


SERVING = """\
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: serve}
spec:
  workloadClass: inference
  resourceGroups:
  - coveredResources: [cpu, memory, nvidia.com/gpu]
    flavors:
    - name: h100
      resources:
      - {name: cpu, nominalQuota: 64}
      - {name: memory, nominalQuota: 512Gi}
      - {name: nvidia.com/gpu, nominalQuota: 8}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: serve, namespace: team-a}
spec: {clusterQueue: serve}
"""


def test_scale_a_serving_workload(qmctl: Run, tmp_path: Path, qm: Client) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET + "---\n" + SERVING)
    qmctl("apply", "-f", str(fleet))
    web = kinds.deployment()
    web["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "serve"
    qmctl("submit", "-f", "-", stdin=yaml.safe_dump(web))
    scaled = qmctl("scale", "llama-8b", "--replicas", "5")
    assert _lines(scaled.stdout) == ["workload/llama-8b scaled to 5 replicas (0 admitted)"]
    picked = json.loads(qmctl("get", "wl", "llama-8b", "-o", "json").stdout)
    assert picked["spec"]["replicas"] == 5 and picked["spec"]["job"]["spec"]["replicas"] == 5
    assert qm.scale("llama-8b", 2, "team-a")["spec"] == {"replicas": 2}
    qmctl("submit", "-f", "-", stdin=yaml.safe_dump(job("train-9")))
    refused = qmctl("scale", "train-9", "--replicas", "2", code=None)
    assert refused.returncode != 0 and "spec.replicas" in refused.stderr, refused.stderr


def test_apply_submits_serving_manifests_as_workloads(qmctl: Run, tmp_path: Path) -> None:
    web, vllm, kv = kinds.deployment(), kinds.vllm_lws(), kinds.statefulset()
    for manifest in (web, vllm, kv):
        manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "serve"
    vllm["spec"]["replicas"] = 1  # within the queue's 8 GPUs a group
    documents = "---\n".join([FLEET, SERVING, *(yaml.safe_dump(m) for m in (web, vllm, kv))])
    applied = _lines(qmctl("apply", "-f", "-", stdin=documents).stdout)
    assert applied[-3:] == [
        "workload/llama-8b created in namespace team-a",
        "workload/vllm created in namespace team-a",
        "workload/kv-cache created in namespace team-a",
    ]
    picked = json.loads(qmctl("get", "wl", "vllm", "-o", "json").stdout)
    assert picked["spec"]["job"]["kind"] == "LeaderWorkerSet"
    assert picked["spec"]["workloadClass"] == "inference"
    # Applied again with other replicas alone, a serving manifest scales, as
    # kubectl apply scales a Deployment; with the same, it is unchanged.
    web["spec"]["replicas"] += 1
    again = _lines(qmctl("apply", "-f", "-", stdin=yaml.safe_dump(web)).stdout)
    assert again[-1].startswith(f"workload/llama-8b scaled to {web['spec']['replicas']} replicas")
    scaled = json.loads(qmctl("get", "wl", "llama-8b", "-o", "json").stdout)
    assert scaled["spec"]["replicas"] == web["spec"]["replicas"]
    same = _lines(qmctl("apply", "-f", "-", stdin=yaml.safe_dump(web)).stdout)
    assert same[-1] == "workload/llama-8b unchanged in namespace team-a"
    daemon = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"}}
    refused = qmctl("apply", "-f", "-", stdin=yaml.safe_dump(daemon), code=None)
    assert refused.returncode != 0 and "DaemonSet" in refused.stderr, refused.stderr


COMMANDS = [
    ["apply"],
    ["get"],
    ["describe"],
    ["delete"],
    ["submit"],
    ["explain"],
    ["cancel"],
    ["scale"],
    ["watch"],
    ["whoami"],
    ["usage"],
    ["ledger", "query"],
    ["ledger", "export"],
    ["ledger", "checkpoint"],
    ["ledger", "verify"],
    ["config", "set-context"],
    ["config", "use-context"],
    ["config", "get-contexts"],
    ["config", "current-context"],
    ["config", "delete-context"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_examples(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=120)
    assert result.exit_code == 0, result.output
    assert "Examples" in result.output and "qmctl " + " ".join(command) in result.output


def test_shell_completion_is_offered() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert "--install-completion" in result.output and "--show-completion" in result.output


def _workload(state: str, reason: str | None = None, active: bool = True) -> Workload:
    conditions = [{"type": "Finished", "status": "True", "reason": reason}] if reason else []
    return Workload.model_validate(
        {
            "metadata": {"name": "w", "namespace": "n"},
            "spec": {"queueName": "q", "podSets": [], "active": active},
            "status": {"state": state, "conditions": conditions},
        }
    )


@pytest.mark.parametrize(
    ("state", "reason", "active", "expected", "code"),
    [
        ("Finished", "Succeeded", True, Outcome.SUCCEEDED, 0),
        ("Finished", "Failed", True, Outcome.FAILED, 3),
        ("Finished", "Preempted", True, Outcome.PREEMPTED, 4),
        ("Preempted", None, False, Outcome.PREEMPTED, 4),
        ("Cancelled", None, True, Outcome.CANCELLED, 6),
    ],
)
def test_how_a_workload_ended_and_the_exit_code_it_gives(
    state: str, reason: str | None, active: bool, expected: Outcome, code: int
) -> None:
    ended = outcome(_workload(state, reason, active))
    assert ended is expected
    assert EXIT_CODES[ended] == code


@pytest.mark.parametrize("state", ["Pending", "Admitted", "Running", "Cancelling", "Preempted"])
def test_a_workload_that_may_still_run_has_no_outcome(state: str) -> None:
    assert outcome(_workload(state)) is None


def test_apply_submits_job_manifests_once(qmctl: Run, tmp_path: Path) -> None:
    documents = FLEET + "---\n" + yaml.safe_dump(job("from-apply"))
    first = qmctl("apply", "-f", "-", stdin=documents)
    assert _lines(first.stdout)[-1] == "workload/from-apply created in namespace team-a"
    second = qmctl("apply", "-f", "-", stdin=documents)
    assert _lines(second.stdout)[-1] == "workload/from-apply unchanged in namespace team-a"
    changed = job("from-apply")
    changed["metadata"]["labels"]["team"] = "other"
    refused = qmctl("apply", "-f", "-", stdin=yaml.safe_dump(changed), code=None)
    assert refused.returncode != 0
    assert "immutable but for its replicas" in refused.stderr, refused.stderr
    deleted = _lines(qmctl("delete", "-f", "-", stdin=documents).stdout)
    assert deleted[0] == "workload/from-apply cancelled in namespace team-a" and len(deleted) == 7


def test_watch_prints_events_and_workloads_as_they_happen(
    qmctl: Run, qm: Client, tmp_path: Path
) -> None:
    qmctl("apply", "-f", "-", stdin=FLEET)
    start = str(qm.head())
    env = {"QMCTL_CONFIG": str(tmp_path / "qmctl" / "config"), "PATH": "/usr/bin:/bin"}
    watchers = [
        subprocess.Popen(
            [*QMCTL, "watch", what, "--since", start, "--timeout", "4s"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for what in ("events", "workloads")
    ]
    # --since: whenever each watcher connects, it starts from ``start``.
    qm.submit(job("watched-1"), namespace="team-a")
    qm.cancel("watched-1", namespace="team-a")
    events, workloads = (w.communicate(timeout=30) for w in watchers)
    assert [w.returncode for w in watchers] == [0, 0], (events, workloads)
    lines = _lines(events[0])
    assert lines[0].split() == ["POSITION", "TIME", "TYPE", "OBJECT", "STATE"]
    assert [line.split()[3] for line in lines[1:]] == ["WorkloadSubmitted", "WorkloadCancelled"]
    assert all("Workload/team-a/watched-1" in line for line in lines[1:])
    assert lines[-1].endswith("Cancelled")
    table = _lines(workloads[0])  # a snapshot, then a line per change
    assert table[-1].split()[3:] == ["WorkloadCancelled", "Workload/team-a/watched-1", "Cancelled"]
    assert sum("watched-1" in line for line in table) >= 2


def test_the_client_imports_nothing_of_the_server() -> None:
    code = (
        "import sys, quartermaster_client, quartermaster_client.cli; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'service', 'workers', 'sim', 'sqlalchemy', 'fastapi', 'celery', 'psycopg'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_ledger_query_export_and_usage(qmctl: Run, qm: Client, tmp_path: Path) -> None:
    qmctl("apply", "-f", "-", stdin=FLEET)
    qmctl("submit", "-f", "-", stdin=yaml.safe_dump(job("audited")))
    entries = list(qm.ledger_entries(page_size=2))  # paged by seq
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    assert all(e.prev_hash == before.hash for before, e in itertools.pairwise(entries))

    rows = _lines(qmctl("ledger", "query").stdout)
    assert rows[0].split() == ["SEQ", "TIME", "KIND", "OBJECT", "ACTOR"]
    assert rows[-1].split()[3:] == ["workload.submitted", "Workload/team-a/audited", "bootstrap"]
    assert "LocalQueue/team-a/train" in rows[5]
    picked = json.loads(
        qmctl(
            "ledger", "query", "-n", "team-a", "--kind", "workload.submitted", "-o", "json"
        ).stdout
    )
    assert [(e["kind"], e["body"]["workload"]) for e in picked] == [
        ("workload.submitted", "audited")
    ]
    assert picked[0]["body"]["requests"]["nvidia.com/gpu"] == 4

    exported = tmp_path / "ledger.ndjson"
    qmctl("ledger", "export", "--file", str(exported))
    documents = [json.loads(line) for line in exported.read_text().splitlines()]
    assert [d["entry_hash"] for d in documents] == [e.hash for e in entries]
    csv = qmctl("ledger", "export", "--format", "csv").stdout.splitlines()
    assert csv[0].startswith("seq,recorded_at,kind") and len(csv) == len(entries) + 1

    assert "No nvidia.com/gpu usage recorded yet." in qmctl("usage").stderr  # nothing admitted
    assert json.loads(qmctl("usage", "--by", "cluster_queue", "-o", "json").stdout) == []
    missing = qmctl("ledger", "checkpoint", code=1)
    assert "no checkpoint has been published yet" in missing.stderr


def test_an_admitted_gang_as_qmctl_shows_and_explains_it(
    qmctl: Run, served: tuple[str, Services], tmp_path: Path
) -> None:
    """The admission cycle (run in process, as the scheduler runs it) admits
    a gang onto one island; qmctl shows where, and why the next one waits."""
    from service.app.admission import AdmissionCycle
    from tests.workers.conftest import setup_fleet
    from tests.workers.conftest import workload as island_workload

    _, services = served
    setup_fleet(services, gpu_quota=16)
    qmctl("submit", "-f", "-", stdin=yaml.safe_dump(island_workload("gang", count=2, island=True)))
    qmctl("submit", "-f", "-", stdin=yaml.safe_dump(island_workload("next", count=2)))
    AdmissionCycle(services.engine, services.unit_of_work).run(lambda uow: None)

    rows = {line.split()[0]: line.split() for line in _lines(qmctl("get", "wl").stdout)[1:]}
    gang, waiting = rows["gang"], rows["next"]
    assert gang[2:4] == ["Admitted", "c1"] and gang[4] in ("c1-i0", "c1-i1") and gang[5] == "16"
    assert waiting[2:6] == ["Pending", "-", "-", "16"]
    explained = _lines(qmctl("explain", "gang").stdout)
    assert explained[0].startswith("Workload team-a/gang is Admitted in LocalQueue train")
    assert f"Admitted to cluster c1, island {gang[4]}, flavor h100." in explained
    assert "cq uses 16 of 16 nominal GPUs; 1 pending, 1 admitted." in explained
    why = qmctl("explain", "next").stdout
    assert "Position 1 of 1 pending in cq." in why
    assert (
        "Why it waits: couldn't assign flavors to pod set workers: insufficient unused quota"
        in (why)
    )
    assert "16 more needed." in why
    cq = _lines(qmctl("get", "cq").stdout)[1].split()
    assert cq[:6] == ["cq", "-", "1", "1", "16/16", "0"]
    admitted = _lines(qmctl("ledger", "query", "--kind", "workload.admitted").stdout)
    assert len(admitted) == 2 and "Workload/team-a/gang" in admitted[1]


def test_get_clusters_shows_each_members_backend(qmctl: Run, qm: Client) -> None:
    """The registration's backend, else what discovery recorded, else ``-``."""
    for name, backend in (("vc-east", "volcano"), ("kq-west", None)):
        spec: dict[str, Any] = {"server": "https://api.example:6443", "credentials": {"token": "t"}}
        if backend:
            spec["backend"] = backend
        qm.apply(
            {
                "apiVersion": "quartermaster.dev/v1",
                "kind": "Cluster",
                "metadata": {"name": name},
                "spec": spec,
            }
        )
    table = _lines(qmctl("get", "clusters").stdout)
    assert table[0].split() == ["NAME", "SERVER", "BACKEND", "CORDONED", "HEALTH", "AGE"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows["vc-east"][2] == "volcano"
    assert rows["kq-west"][2] == "-"
    assert qm.get("Cluster", "vc-east").backend == "volcano"
    for name in ("vc-east", "kq-west"):
        qmctl("delete", "cluster", name)


def test_apply_registers_a_kubeflow_training_runtime_as_trainer_writes_it(
    qmctl: Run, qm: Client
) -> None:
    """Kubeflow Trainer's own ``torch-distributed`` ClusterTrainingRuntime, applied
    as is (``trainer.kubeflow.org/v1alpha1``), and got back by its names."""
    from tests.api.test_training_runtimes import TORCH_DISTRIBUTED

    text = yaml.safe_dump(TORCH_DISTRIBUTED)
    applied = qmctl("apply", "-f", "-", stdin=text)
    assert _lines(applied.stdout) == ["clustertrainingruntime/torch-distributed created"]
    again = qmctl("apply", "-f", "-", stdin=text)
    assert _lines(again.stdout) == ["clustertrainingruntime/torch-distributed unchanged"]
    listed = _lines(qmctl("get", "ctr").stdout)
    assert listed[1].split()[0] == "torch-distributed"
    shown = yaml.safe_load(
        qmctl("get", "clustertrainingruntime", "torch-distributed", "-o", "yaml").stdout
    )
    assert shown["spec"] == TORCH_DISTRIBUTED["spec"]
