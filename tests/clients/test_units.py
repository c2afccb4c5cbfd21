"""The client's pure parts: Kueue translation, apply's diff, the SSE
decoder, explanations and table columns of admitted workloads (which need
workers to exist live), and a server that is not there."""

from __future__ import annotations

import io
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from quartermaster_client import Client, ClusterQueue, RetryPolicy, TransportError, Workload
from quartermaster_client._http import SSEDecoder
from quartermaster_client.apply import differs, kueue_to_quartermaster
from quartermaster_client.cli.render import Context, age, render_table
from quartermaster_client.cli.usage import _chart
from quartermaster_client.explain import QueueUsage, amount, in_words, queue_usage, summary
from quartermaster_client.kinds import lookup
from quartermaster_client.ledger import MerkleRoot, canonical_json
from quartermaster_client.manifests import ManifestError, load
from quartermaster_client.models import GPU, Explanation, UsageRow
from quartermaster_client.outcomes import waiting_for

from tests.clients.conftest import gpu_pod

ADMISSION = {  # as the admission cycle writes it (service/app/admission/__init__.py)
    "clusterQueue": "team-a",
    "cluster": "east-1",
    "island": "block-3",
    "podSetAssignments": [
        {
            "name": "workers",
            "count": 4,
            "flavors": {"nvidia.com/gpu": "h100", "cpu": "h100"},
            "resourceUsage": {"nvidia.com/gpu": "32", "cpu": "32"},
            "placement": [{"node": "n1", "count": 4}],
            "islands": ["block-3"],
        }
    ],
    "borrowed": {"h100": {"nvidia.com/gpu": "8"}},
    "preempted": [],
    "admittedAt": "2026-01-01T00:01:00Z",
}


def test_kueue_v1beta1_and_v1beta2_manifests_are_translated() -> None:
    body, notes = kueue_to_quartermaster(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "ClusterQueue",
            "metadata": {
                "name": "team-a",
                "uid": "x",
                "resourceVersion": "9",
                "managedFields": [],
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
            },
            "spec": {"cohort": "research", "admissionChecks": ["prov"], "resourceGroups": []},
            "status": {"pendingWorkloads": 3},
        }
    )
    assert body == {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "ClusterQueue",
        "metadata": {"name": "team-a"},
        "spec": {"cohortName": "research", "resourceGroups": []},
    }
    assert notes == ["ClusterQueue team-a: spec.admissionChecks has no Quartermaster meaning"]
    workload, _ = kueue_to_quartermaster(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": "w", "namespace": "team-a"},
            "spec": {"queueName": "train", "priorityClassRef": {"name": "urgent"}, "podSets": []},
        }
    )
    assert workload["spec"] == {"queueName": "train", "priorityClassName": "urgent", "podSets": []}
    native = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}}
    assert kueue_to_quartermaster(native) == (native, [])


def test_apply_replaces_only_when_a_given_field_differs() -> None:
    current = {
        "metadata": {"name": "cq", "resourceVersion": "7", "labels": {}},
        "spec": {"queueingStrategy": "BestEffortFIFO", "quota": [{"n": 64, "b": True}]},
        "status": {"pendingWorkloads": 2},
    }
    assert not differs({"metadata": {"name": "cq"}, "spec": {"quota": [{"n": 64}]}}, current)
    assert not differs({"spec": {"quota": [{"n": "64"}]}, "status": {}}, current)
    assert differs({"spec": {"quota": [{"n": 65}]}}, current)
    assert differs({"spec": {"quota": [{"n": 64}, {"n": 1}]}}, current)
    assert differs({"spec": {"quota": [{"b": 1}]}}, current)  # True is not 1
    assert differs({"metadata": {"labels": {"team": "a"}}}, current)


def test_the_event_stream_decoder() -> None:
    decoder = SSEDecoder()
    lines = ["retry: 1500", "", ": heartbeat", "", "id: 7", "event: X", "data: {", "data: }", ""]
    events = [e for e in (decoder.feed(line) for line in lines) if e is not None]
    assert events == [("7", "X", "{\n}")]
    assert decoder.retry == 1.5 and decoder.last_id == "7"


def _workload(status: dict[str, Any], name: str = "w") -> Workload:
    return Workload.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": "team-a",
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {
                "queueName": "train",
                "podSets": [{"name": "workers", "count": 4, "template": gpu_pod(8)}],
            },
            "status": status,
        }
    )


def test_admitted_workloads_show_cluster_island_and_gpus() -> None:
    admitted = _workload({"state": "Running", "clusterQueue": "team-a", "admission": ADMISSION})
    pending = _workload({"state": "Pending", "clusterQueue": "team-a"}, "p")
    text = render_table(lookup("wl"), [admitted, pending], True, True, Context())
    header, first, second = text.splitlines()
    assert header.split() == [
        "NAMESPACE",
        "NAME",
        "QUEUE",
        "STATE",
        "CLUSTER",
        "ISLAND",
        "GPUS",
        "AGE",
        "CLUSTERQUEUE",
        "PRIORITY",
        "FLAVOR",
        "REASON",
    ]
    assert first.split()[:7] == ["team-a", "w", "train", "Running", "east-1", "block-3", "32"]
    assert first.split()[8:11] == ["team-a", "0", "h100"]
    assert second.split()[:7] == ["team-a", "p", "train", "Pending", "-", "-", "32"]

    cq = ClusterQueue.model_validate(
        {
            "metadata": {"name": "team-a"},
            "spec": {"cohortName": "research", "resourceGroups": _gpu_group(24)},
        }
    )
    usage = queue_usage(cq, [admitted, pending])
    assert usage == QueueUsage(pending=1, admitted=1, used=32, nominal=24, borrowed=8)
    row = render_table(lookup("cq"), [cq], False, False, Context(lambda: [admitted, pending]))
    assert row.splitlines()[1].split()[:6] == ["team-a", "research", "1", "1", "32/24", "8"]


def _gpu_group(nominal: int) -> list[dict[str, Any]]:
    """One resource group: ``nominal`` GPUs of flavor h100."""
    quota = [{"name": "nvidia.com/gpu", "nominalQuota": nominal}]
    return [
        {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "h100", "resources": quota}]}
    ]


def _replica(index: int, cluster: str, island: str) -> dict[str, Any]:
    """One replica of 8 GPUs as the centre records it in replicaAdmissions."""
    assignment = {**ADMISSION["podSetAssignments"][0], "count": 1, "islands": [island]}
    assignment["resourceUsage"] = {"nvidia.com/gpu": "8", "cpu": "8"}
    admission = {
        **ADMISSION,
        "cluster": cluster,
        "island": island,
        "podSetAssignments": [assignment],
    }
    return {"replica": index, "admission": admission, "admittedAt": "2026-01-01T00:01:00Z"}


def test_a_serving_workload_shows_and_counts_every_admitted_replica() -> None:
    """Three of four replicas admitted in two clusters: the table names both
    clusters and their islands and shows the 24 GPUs held; its queue counts
    them (not one replica's request); nothing admitted shows what is asked."""
    units = [
        _replica(0, "east-1", "e-i0"),
        _replica(1, "east-1", "e-i0"),
        _replica(2, "eu-1", "u-i1"),
    ]
    serving = _workload({"state": "Running", "clusterQueue": "team-a", "replicaAdmissions": units})
    serving.spec.pod_sets[0].count = 1
    serving.spec.replicas = 4
    waiting = _workload({"state": "Pending", "clusterQueue": "team-a"}, "p")
    waiting.spec.pod_sets[0].count = 1
    waiting.spec.replicas = 4
    text = render_table(lookup("wl"), [serving, waiting], False, False, Context())
    _, first, second = text.splitlines()
    assert first.split()[:6] == ["w", "train", "Running", "east-1,eu-1", "e-i0,u-i1", "24"]
    assert second.split()[:6] == ["p", "train", "Pending", "-", "-", "32"]
    cq = ClusterQueue.model_validate(
        {"metadata": {"name": "team-a"}, "spec": {"resourceGroups": _gpu_group(16)}}
    )
    usage = queue_usage(cq, [serving, waiting])
    assert usage == QueueUsage(pending=1, admitted=1, used=24, nominal=16, borrowed=8)
    # Past two clusters or islands a row counts the rest; -o wide names them all.
    units.append(_replica(3, "west-1", "w-i0"))
    spread = _workload({"state": "Running", "clusterQueue": "team-a", "replicaAdmissions": units})
    spread.spec.pod_sets[0].count = 1
    row = render_table(lookup("wl"), [spread], False, False, Context()).splitlines()[1]
    assert row.split()[3:5] == ["east-1,eu-1,+1", "e-i0,u-i1,+1"]
    wide = render_table(lookup("wl"), [spread], True, False, Context()).splitlines()[1]
    assert wide.split()[3:5] == ["east-1,eu-1,west-1", "e-i0,u-i1,w-i0"]


def test_a_serving_workloads_replicas_explained_in_words() -> None:
    explanation = Explanation.model_validate(
        {
            "workload": "serving/chat",
            "state": "Running",
            "localQueue": "default",
            "replicas": {
                "asked": 18,
                "admitted": 16,
                "waiting": 2,
                "reason": "Pending",
                "waitingFor": "insufficient unused quota for nvidia.com/gpu in flavor a100.",
            },
        }
    )
    said = (
        "Replicas: 16 of 18 admitted; 2 waiting: "
        "insufficient unused quota for nvidia.com/gpu in flavor a100."
    )
    assert said in in_words(explanation)
    explanation.replicas.waiting, explanation.replicas.admitted = 0, 18  # type: ignore[union-attr]
    assert "Replicas: 18 of 18 admitted." in in_words(explanation)


def test_an_admitted_workload_explained_in_words() -> None:
    explanation = Explanation.model_validate(
        {
            "workload": "team-a/w",
            "state": "Admitted",
            "reason": "Admitted",
            "message": "admitted to east-1",
            "clusterQueue": "team-a",
            "localQueue": "train",
            "priority": 100,
            "requests": {"nvidia.com/gpu": 32, "cpu": 32500, "memory": 256 * 2**30},
            "admission": ADMISSION,
        }
    )
    usage = QueueUsage(pending=3, admitted=1, used=32, nominal=24, borrowed=8)
    assert in_words(explanation, usage) == [
        "Workload team-a/w is Admitted in LocalQueue train (ClusterQueue team-a), priority 100.",
        "It asks for 32 nvidia.com/gpu, 32500m cpu, 256Gi memory in all.",
        "Admitted to cluster east-1, island block-3, flavor h100.",
        "  pod set workers: 4 pods, flavor h100, on n1 (4)",
        "Latest condition: Admitted: admitted to east-1",
        "team-a uses 32 of 24 nominal GPUs and is borrowing 8 GPUs from its cohort; "
        "3 pending, 1 admitted.",
    ]
    assert amount("memory", 1536 * 2**20) == "1536Mi" and amount("cpu", 8000) == "8"


def test_borrowed_is_what_is_in_use_beyond_each_flavors_nominal_now() -> None:
    def on(flavor: str, gpus: int, name: str) -> Workload:
        assignment = {
            "name": "main",
            "count": gpus // 8,
            "flavors": {"nvidia.com/gpu": flavor},
            "resourceUsage": {"nvidia.com/gpu": str(gpus)},
        }
        # Recorded when admitted, while the queue borrowed: stale since.
        admission = {**ADMISSION, "podSetAssignments": [assignment]}
        return _workload(
            {"state": "Running", "clusterQueue": "team-a", "admission": admission}, name
        )

    flavors = [
        {"name": f, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 32}]}
        for f in ("h100", "a100")
    ]
    cq = ClusterQueue.model_validate(
        {
            "metadata": {"name": "team-a"},
            "spec": {
                "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": flavors}]
            },
        }
    )
    both = queue_usage(cq, [on("h100", 48, "a"), on("a100", 16, "b")])
    assert (both.used, both.nominal, both.borrowed) == (64, 64, 16)
    alone = queue_usage(cq, [on("a100", 16, "b")])
    assert (alone.used, alone.borrowed) == (16, 0)


def test_a_pending_gang_explained_in_short() -> None:
    waiting = (
        "couldn't assign flavors to pod set main: insufficient unused quota for "
        "nvidia.com/gpu in flavor h100, 16 more needed; flavor a100 doesn't match node affinity"
    )
    explanation = Explanation.model_validate(
        {
            "workload": "language/pretrain",
            "state": "Pending",
            "reason": "NoMatchingFlavor",
            "message": waiting,
            "clusterQueue": "language",
            "localQueue": "default",
            "priority": 100,
            "requests": {"nvidia.com/gpu": 48},
            "positionInQueue": 3,
            "pendingInClusterQueue": 12,
            "waitingFor": waiting,
        }
    )
    usage = QueueUsage(pending=12, admitted=1, used=80, nominal=64, borrowed=16)
    lines = in_words(explanation, usage)
    assert lines[1] == (
        "In short: needs 16 more GPUs of flavor h100; position 3 of 12 in language; "
        "language is borrowing 16 GPUs."
    )
    assert lines[-2] == f"Why it waits: {waiting}."
    never = explanation.model_copy(
        update={
            "waiting_for": "no schedulable cluster in flavor h100 could hold 9 pod(s) of "
            "{nvidia.com/gpu: 8} within one island, even if it were empty"
        }
    )
    assert summary(never) == (
        "can never fit: no cluster is large enough; position 3 of 12 in language"
    )
    fragmented = explanation.model_copy(
        update={
            "waiting_for": "no cluster has room now for 5 pod(s) of {nvidia.com/gpu: 8} in "
            "flavor h100: fragmented across islands: 40 nvidia.com/gpu of flavor h100 are "
            "free in the fleet, 40 needed in one island, but the largest free island "
            "(c1/c1-b) has 32"
        }
    )
    assert summary(fragmented) == (
        "fragmentation: enough is free in the fleet, but no single island has room; "
        "position 3 of 12 in language"
    )
    assert in_words(fragmented)[-2].startswith("Why it waits: no cluster has room now")
    assert "the largest free island (c1/c1-b) has 32." in in_words(fragmented)[-2]
    first = explanation.model_copy(update={"waiting_for": None, "position_in_queue": 1})
    assert summary(first) is None  # the position alone is already a line of its own


def test_ages_read_like_kubectl() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 1, 3, 0, 0, 0, tzinfo=UTC)
    assert age("2026-01-02T23:59:30Z", now) == "30s"
    assert age("2026-01-02T23:58:00Z", now) == "2m"
    assert age("2026-01-02T20:00:00Z", now) == "4h"
    assert age("2026-01-01T00:00:00Z", now) == "2d"
    assert age(None, now) == "-"


def test_a_server_that_is_not_there_is_a_transport_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        policy = RetryPolicy(attempts=3, backoff=0.05, max_backoff=0.05)
        with Client(f"http://127.0.0.1:{port}", "t", retry=policy) as client:
            started = time.monotonic()
            with pytest.raises(TransportError) as error:
                client.whoami()
            assert time.monotonic() - started >= 0.05  # it waited between attempts
    assert "ConnectError" in str(error.value)


def test_manifests_from_a_directory_stdin_and_lists(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "kind: Cohort\nmetadata: {name: a}\n---\n---\nkind: Topology\n"
    )
    (tmp_path / "b.yml").write_text(
        "kind: List\nitems:\n- {kind: ResourceFlavor, metadata: {name: b}}\n"
    )
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.json").write_text('{"kind": "ClusterQueue", "metadata": {"name": "c"}}')
    found = load([str(tmp_path)])
    assert [(m.kind, m.source) for m in found] == [
        ("Cohort", f"{tmp_path}/a.yaml#0"),
        ("Topology", f"{tmp_path}/a.yaml#2"),
        ("ResourceFlavor", f"{tmp_path}/b.yml"),
    ]
    assert [m.name for m in load([str(tmp_path)], recursive=True)][-1] == "c"
    assert [m.kind for m in load(["-"], stdin=io.StringIO("kind: Cohort\n"))] == ["Cohort"]
    with pytest.raises(ManifestError, match="no such file"):
        load([str(tmp_path / "missing.yaml")])
    with pytest.raises(ManifestError, match="expected an object"):
        load(["-"], stdin=io.StringIO("- 1\n- 2\n"))


def test_usage_chart_bars_scale_to_the_largest_group() -> None:
    rows = [
        UsageRow.model_validate({"period": p, "namespace": ns, "resource": GPU, "hours": h})
        for p, ns, h in (("d1", "team-a", 30.0), ("d2", "team-a", 10.0), ("d1", "team-b", 10.0))
    ]
    lines = _chart(rows, ["namespace"]).splitlines()
    assert lines[0].startswith("team-a nvidia.com/gpu") and lines[0].endswith("40.00 h")
    assert lines[0].count("█") == 40 and lines[1].count("█") == 10


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (0.0, "0"),
        (-0.0, "0"),
        (1.0, "1"),
        (123.0, "123"),
        (0.1, "0.1"),
        (-2.5, "-2.5"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e22, "1.5e+22"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (1.2345e-9, "1.2345e-9"),
        (123456789.125, "123456789.125"),
        (5e-324, "5e-324"),
    ],
)
def test_numbers_are_written_as_ecmascript_does(number: float, text: str) -> None:
    assert canonical_json([number]) == f"[{text}]".encode()


DOCUMENTS: list[Any] = [
    {"b": 1, "a": [True, False, None], "c": {"z": 'ü\n\t"\\', "y": 0.25}},
    {"é": 1, "e": 2, "\U0001f600": 3, "\ufb33": 4, "Z": 5},
    {"consumed": {"h100": {"nvidia.com/gpu": 28800.0, "cpu": 1.5e-7, "memory": 3.2e21}}},
    {"seq": 2**53 - 1, "neg": -17, "s": "\x01\x1f\u2028"},
]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_canonical_json_is_the_services(document: dict[str, Any]) -> None:
    from service.ledger.canonical import canonical_json as services

    assert canonical_json(document) == services(document)


def test_merkle_roots_are_the_services() -> None:
    from service.ledger.merkle import CompactRange, leaf_hash

    ours, theirs = MerkleRoot(), CompactRange()
    assert ours.root() == theirs.root()
    for index in range(1, 40):
        leaf = f"leaf {index}".encode()
        ours.append(leaf)
        theirs.append(leaf_hash(leaf))
        assert ours.root() == theirs.root(), index


def test_wait_for_reads_states_and_conditions_as_kubectl_wait_does() -> None:
    ready = {"type": "PodsReady", "status": "True", "reason": "PodsReady"}
    not_ready = {**ready, "status": "False"}
    running = _workload({"state": "Running", "conditions": [not_ready, ready]})
    admitted = _workload({"state": "Admitted", "conditions": [ready, not_ready]})
    assert waiting_for("state=Running")(running)
    assert not waiting_for("state=Running")(admitted)
    assert waiting_for("state=Admitted, Running")(admitted)
    assert waiting_for("condition=PodsReady")(running)
    assert not waiting_for("condition=PodsReady")(admitted)  # the latest one counts
    assert waiting_for("condition=PodsReady=false")(admitted)
    assert not waiting_for("condition=PodsReady=False")(running)
    serving = _workload({"state": "Running", "replicaAdmissions": [_replica(0, "c", "i")] * 2})
    assert waiting_for("replicas=2")(serving)
    assert not waiting_for("replicas=3")(serving) and not waiting_for("replicas=1")(serving)
    for bad in ("Running", "state=", "condition=A,B", "phase=Running", "replicas=two"):
        with pytest.raises(ValueError, match="is not state=STATE"):
            waiting_for(bad)
    with pytest.raises(ValueError, match="true or false"):
        waiting_for("condition=PodsReady=maybe")


def test_the_verifier_reads_the_checkpoint_an_export_opens_with() -> None:
    """The client's verifier and the service's export agree on the opening
    checkpoint line: with the signer's key it verifies, with another it does not."""
    from quartermaster_client.ledger import verify_export

    from service.ledger.checkpoint import NoteSigner
    from service.ledger.export import export_ndjson
    from service.ledger.memory import InMemoryLedger
    from service.ledger.proofs import LedgerTree
    from tests.ledger.test_verify import new_entry

    ledger = InMemoryLedger()
    ledger.append([new_entry(i) for i in range(5)])
    signer, stranger = NoteSigner.generate("qm.test/ledger")[0], NoteSigner.generate("x")[0]
    tree = LedgerTree("qm.test/ledger")
    tree.extend(ledger.entries)
    lines = list(export_ndjson(ledger.entries, tree.signed_checkpoint(signer, 3)))
    report = verify_export(lines, verifier_key=signer.verifier_key)
    assert report.verified and report.checkpoint_from == "export", report.breaks
    assert report.entries == 5 and report.unsigned == 2
    assert not verify_export(lines, verifier_key=stranger.verifier_key).verified
    assert not verify_export(lines[1:], verifier_key=signer.verifier_key).verified


def test_an_error_message_says_each_field_error_once() -> None:
    """Details that repeat the field errors (joined, or one of them) are cut
    to what they add; a detail that says something else is kept."""
    from quartermaster_client.errors import FieldError, Invalid

    def message(detail: str, *errors: tuple[str, str]) -> str:
        found = [FieldError(field, text) for field, text in errors]
        return str(Invalid(422, "invalid", "Invalid object", detail, found))

    joined = message(
        "the submission is invalid: a: must be set; b.c: too big",
        ("a", "must be set"),
        ("b.c", "too big"),
    )
    assert (
        joined == "422 Invalid object: the submission is invalid\n  a: must be set\n  b.c: too big"
    )
    assert message("bad", ("q", "bad")) == "422 Invalid object\n  q: bad"
    assert (
        message("invalid: since", ("since", "not a time"))
        == "422 Invalid object\n  since: not a time"
    )
    other = message("ClusterQueue is invalid", ("spec.cohortName", "bad name"))
    assert other == "422 Invalid object: ClusterQueue is invalid\n  spec.cohortName: bad name"


@pytest.mark.parametrize(
    ("api_version", "kind", "becomes"),
    [
        ("kueue.x-k8s.io/v1beta2", "LocalQueue", "LocalQueue"),
        ("quartermaster.dev/v1", "Cluster", "Cluster"),
        ("kueue.x-k8s.io/v1beta2", "Workload", "Workload"),
        ("batch/v1", "Job", "Workload"),
        ("kubeflow.org/v1", "PyTorchJob", "Workload"),
        ("batch.volcano.sh/v1alpha1", "Job", "Workload"),
        ("apps/v1", "Deployment", "Workload"),
        ("apps/v1", "StatefulSet", "Workload"),
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "Workload"),
        ("", "ClusterQueue", "ClusterQueue"),
        ("scheduling.volcano.sh/v1beta1", "Queue", "ClusterQueue"),
        ("scheduling.volcano.sh/v1beta1", "PodGroup", None),
        ("kueue.x-k8s.io/v1beta2", "AdmissionCheck", None),
        ("kueue.x-k8s.io/v1beta2", "localqueue", None),
        ("v1", "ConfigMap", None),
    ],
)
def test_a_manifest_is_the_kind_its_api_group_and_kind_name(
    api_version: str, kind: str, becomes: str | None
) -> None:
    from quartermaster_client.kinds import of_manifest

    if becomes is not None:
        assert of_manifest(api_version, kind).kind == becomes
        return
    with pytest.raises(KeyError) as refused:
        of_manifest(api_version, kind)
    assert f"apiVersion {api_version} kind {kind} is not something" in refused.value.args[0]


def test_kind_names_on_the_command_line_respect_the_group() -> None:
    assert lookup("queue").kind == "LocalQueue"
    assert lookup("clusterqueues.v1beta2.kueue.x-k8s.io").kind == "ClusterQueue"
    assert lookup("cq.quartermaster.dev").kind == "ClusterQueue"
    for name in ("queues.scheduling.volcano.sh", "queue.v1beta1.scheduling.volcano.sh"):
        with pytest.raises(KeyError, match=r"scheduling\.volcano\.sh is not an API group"):
            lookup(name)
