"""The security floor as a table: each row breaks one control of the Pod
Security Standards (or one of our rules) in an otherwise clean template,
and must be refused at the field it names; the clean template passes."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from service.app.floor import check_pod, digest_problem, relaxations
from service.app.schemas import SecurityPolicy
from service.app.workloads import SubmissionError, parse_submission, pod_templates

DIGEST = "registry.example/train@sha256:" + "a" * 64
RESTRICTED = SecurityPolicy()
Template = dict[str, Any]


def clean() -> Template:
    return {
        "metadata": {"annotations": {}},
        "spec": {
            "serviceAccountName": "trainer",
            "runtimeClassName": "nvidia",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": DIGEST,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "resources": {"limits": {"nvidia.com/gpu": 8}},
                }
            ],
        },
    }


def _container(t: Template, **context: Any) -> None:
    t["spec"]["containers"][0]["securityContext"].update(context)


def _init(t: Template) -> Template:
    init = copy.deepcopy(t["spec"]["containers"][0])
    init["name"] = "init"
    t["spec"]["initContainers"] = [init]
    return init


def _sys_admin_in_init(t: Template) -> None:
    _init(t)["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]


def _ephemeral(t: Template) -> None:
    t["spec"]["ephemeralContainers"] = [
        {"name": "debug", "image": DIGEST, "securityContext": {"privileged": True}}
    ]


C = "spec.containers[0]"
#: (what is broken, how, the field the refusal must name)
ROWS: list[tuple[str, Callable[[Template], None], str]] = [
    ("privileged", lambda t: _container(t, privileged=True), f"{C}.securityContext.privileged"),
    (
        "capability SYS_ADMIN",
        lambda t: _container(t, capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
        f"{C}.securityContext.capabilities.add[0]",
    ),
    (
        "capability ALL",
        lambda t: _container(t, capabilities={"drop": ["ALL"], "add": ["ALL"]}),
        f"{C}.securityContext.capabilities.add[0]",
    ),
    (
        "capability CHOWN (baseline allows it, restricted does not)",
        lambda t: _container(t, capabilities={"drop": ["ALL"], "add": ["CHOWN"]}),
        f"{C}.securityContext.capabilities.add[0]",
    ),
    (
        "SYS_ADMIN in an init container",
        _sys_admin_in_init,
        "spec.initContainers[0].securityContext.capabilities.add[0]",
    ),
    ("an ephemeral container", _ephemeral, "spec.ephemeralContainers"),
    (
        "a privileged ephemeral container",
        _ephemeral,
        "spec.ephemeralContainers[0].securityContext.privileged",
    ),
    (
        "capabilities not dropped",
        lambda t: _container(t, capabilities={}),
        f"{C}.securityContext.capabilities.drop",
    ),
    (
        "privilege escalation left unset",
        lambda t: t["spec"]["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
        f"{C}.securityContext.allowPrivilegeEscalation",
    ),
    (
        "privilege escalation as a string",
        lambda t: _container(t, allowPrivilegeEscalation="true"),
        f"{C}.securityContext.allowPrivilegeEscalation",
    ),
    (
        "a host port",
        lambda t: t["spec"]["containers"][0].update(
            ports=[{"containerPort": 80, "hostPort": 8080}]
        ),
        f"{C}.ports[0].hostPort",
    ),
    (
        "root in the container",
        lambda t: _container(t, runAsUser=0),
        f"{C}.securityContext.runAsUser",
    ),
    (
        "root in the pod",
        lambda t: t["spec"]["securityContext"].update(runAsUser=0),
        "spec.securityContext.runAsUser",
    ),
    (
        "runAsNonRoot false in a container",
        lambda t: _container(t, runAsNonRoot=False),
        f"{C}.securityContext.runAsNonRoot",
    ),
    (
        "runAsNonRoot unset everywhere",
        lambda t: t["spec"]["securityContext"].pop("runAsNonRoot"),
        f"{C}.securityContext.runAsNonRoot",
    ),
    (
        "procMount Unmasked",
        lambda t: _container(t, procMount="Unmasked"),
        f"{C}.securityContext.procMount",
    ),
    (
        "seccomp Unconfined in the pod",
        lambda t: t["spec"]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "spec.securityContext.seccompProfile.type",
    ),
    (
        "seccomp Unconfined in a container",
        lambda t: _container(t, seccompProfile={"type": "Unconfined"}),
        f"{C}.securityContext.seccompProfile.type",
    ),
    (
        "seccomp unset everywhere",
        lambda t: t["spec"]["securityContext"].pop("seccompProfile"),
        f"{C}.securityContext.seccompProfile.type",
    ),
    (
        "Windows hostProcess in the pod",
        lambda t: t["spec"]["securityContext"].update(windowsOptions={"hostProcess": True}),
        "spec.securityContext.windowsOptions.hostProcess",
    ),
    (
        "Windows hostProcess in a container",
        lambda t: _container(t, windowsOptions={"hostProcess": True}),
        f"{C}.securityContext.windowsOptions.hostProcess",
    ),
    ("hostNetwork", lambda t: t["spec"].update(hostNetwork=True), "spec.hostNetwork"),
    ("hostPID", lambda t: t["spec"].update(hostPID=True), "spec.hostPID"),
    ("hostIPC", lambda t: t["spec"].update(hostIPC=True), "spec.hostIPC"),
    (
        "a hostPath volume",
        lambda t: t["spec"].update(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
        "spec.volumes[0].hostPath",
    ),
    (
        "an nfs volume (restricted allows only the listed types)",
        lambda t: t["spec"].update(volumes=[{"name": "n", "nfs": {"server": "s", "path": "/"}}]),
        "spec.volumes[0].nfs",
    ),
    (
        "an unsafe sysctl",
        lambda t: t["spec"]["securityContext"].update(
            sysctls=[{"name": "kernel.msgmax", "value": "1"}]
        ),
        "spec.securityContext.sysctls[0].name",
    ),
    (
        "AppArmor unconfined by annotation",
        lambda t: t["metadata"]["annotations"].update(
            {"container.apparmor.security.beta.kubernetes.io/main": "unconfined"}
        ),
        "metadata.annotations.container.apparmor.security.beta.kubernetes.io/main",
    ),
    (
        "AppArmor Unconfined by field",
        lambda t: _container(t, appArmorProfile={"type": "Unconfined"}),
        f"{C}.securityContext.appArmorProfile.type",
    ),
    (
        "an SELinux type outside the allowed ones",
        lambda t: _container(t, seLinuxOptions={"type": "spc_t"}),
        f"{C}.securityContext.seLinuxOptions.type",
    ),
    (
        "an SELinux user",
        lambda t: t["spec"]["securityContext"].update(seLinuxOptions={"user": "system_u"}),
        "spec.securityContext.seLinuxOptions.user",
    ),
    (
        "an image by tag",
        lambda t: t["spec"]["containers"][0].update(image="evil/miner:latest"),
        f"{C}.image",
    ),
    (
        "an empty digest",
        lambda t: t["spec"]["containers"][0].update(image="x@sha256:"),
        f"{C}.image",
    ),
    (
        "a digest too short",
        lambda t: t["spec"]["containers"][0].update(image="x:latest@sha256:zz"),
        f"{C}.image",
    ),
    (
        "a placeholder digest",
        lambda t: t["spec"]["containers"][0].update(
            image="registry.example.com/ml/trainer@sha256:REPLACE"
        ),
        f"{C}.image",
    ),
    (
        "the default service account",
        lambda t: t["spec"].pop("serviceAccountName"),
        "spec.serviceAccountName",
    ),
    (
        "a GPU pod without a runtime class",
        lambda t: t["spec"].pop("runtimeClassName"),
        "spec.runtimeClassName",
    ),
    (
        "a node named by the submitter",
        lambda t: t["spec"].update(nodeName="gpu-17"),
        "spec.nodeName",
    ),
]


def test_a_clean_template_meets_the_restricted_floor() -> None:
    assert check_pod(clean(), "", RESTRICTED) == []


@pytest.mark.parametrize(("what", "breaks", "field"), ROWS, ids=[r[0] for r in ROWS])
def test_each_control_is_refused_where_it_is_broken(
    what: str, breaks: Callable[[Template], None], field: str
) -> None:
    template = clean()
    breaks(template)
    fields = [path for path, _ in check_pod(template, "", RESTRICTED)]
    assert field in fields, f"{what}: refused at {fields}"


def test_baseline_allows_what_only_restricted_forbids() -> None:
    template = clean()
    template["spec"]["securityContext"] = {}
    template["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["CHOWN"]}}
    template["spec"]["volumes"] = [{"name": "n", "nfs": {"server": "s", "path": "/"}}]
    baseline = SecurityPolicy(level="baseline")
    assert check_pod(template, "", baseline) == []
    assert len(check_pod(template, "", RESTRICTED)) == 6
    template["spec"]["containers"][0]["securityContext"]["privileged"] = True
    assert [p for p, _ in check_pod(template, "", baseline)] == [
        "spec.containers[0].securityContext.privileged"
    ]


def test_digests_are_parsed_not_searched_for() -> None:
    assert digest_problem(DIGEST) is None
    assert digest_problem("reg:5000/a/b:tag@sha256:" + "0" * 64) is None
    assert digest_problem("x@sha512:" + "f" * 128) is None
    for image in ("x@sha256:" + "a" * 63, "x@sha256:" + "A" * 64, "x@md5:" + "a" * 32, "", 7):
        assert digest_problem(image) is not None, image


def test_relaxations_name_every_rule_weakened() -> None:
    assert relaxations(RESTRICTED, RESTRICTED) == []
    assert relaxations(SecurityPolicy(level="privileged"), RESTRICTED) == []
    weaker = SecurityPolicy(level="baseline", requireImageDigest=False, allowHostPath=True)
    assert relaxations(RESTRICTED, weaker) == [
        "level: restricted -> baseline",
        "requireImageDigest: True -> False",
        "allowHostPath: False -> True",
    ]


# -- what is checked is what runs ---------------------------------------------------------


def _job(template: Template, parallelism: int = 1, cpu: str = "1") -> dict[str, Any]:
    template["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"parallelism": parallelism, "template": template},
    }


def _workload(job: dict[str, Any] | None, pod_sets: list[dict[str, Any]] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"queueName": "q"}
    if job is not None:
        spec["job"] = job
    if pod_sets is not None:
        spec["podSets"] = pod_sets
    return {"kind": "Workload", "metadata": {"name": "w"}, "spec": spec}


def test_a_workloads_job_is_what_the_floor_checks() -> None:
    evil = clean()
    _container(evil, privileged=True)
    evil["spec"]["hostPID"] = True
    body = _workload(_job(evil), [{"name": "main", "count": 1, "template": clean()}])
    with pytest.raises(SubmissionError) as refused:
        parse_submission(body)
    assert "spec.podSets[0].template" in [p for p, _ in refused.value.problems]
    workload = parse_submission(_workload(_job(evil), None))
    paths = [path for path, _ in pod_templates(workload.spec)]
    assert paths == ["spec.job.spec.template"]
    found = {
        p for path, t in pod_templates(workload.spec) for p, _ in check_pod(t, path, RESTRICTED)
    }
    assert "spec.job.spec.template.spec.hostPID" in found
    assert "spec.job.spec.template.spec.containers[0].securityContext.privileged" in found


def test_the_quota_charged_is_the_jobs() -> None:
    job = _job(clean(), parallelism=20, cpu="50")
    small = copy.deepcopy(job["spec"]["template"])
    small["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    with pytest.raises(SubmissionError) as refused:
        parse_submission(_workload(job, [{"name": "main", "count": 1, "template": small}]))
    fields = [p for p, _ in refused.value.problems]
    assert "spec.podSets[0].count" in fields and "spec.podSets[0].template" in fields
    workload = parse_submission(_workload(job, None))
    assert [(p.name, p.count) for p in workload.spec.podSets] == [("main", 20)]
    assert workload.spec._totals == {"cpu": 20 * 50_000}


def test_templates_of_replicas_that_run_no_pod_are_checked_too() -> None:
    evil = clean()
    _container(evil, privileged=True)
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "p", "labels": {"kueue.x-k8s.io/queue-name": "q"}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": clean()},
                "Worker": {"replicas": 0, "template": evil},
            }
        },
    }
    workload = parse_submission(job)
    assert [p.name for p in workload.spec.podSets] == ["master"]
    found = [
        p for path, t in pod_templates(workload.spec) for p, _ in check_pod(t, path, RESTRICTED)
    ]
    assert found == [
        "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].securityContext.privileged"
    ]


def test_strings_are_not_booleans_in_a_pod_template() -> None:
    template = clean()
    _container(template, allowPrivilegeEscalation="true")
    with pytest.raises(SubmissionError) as refused:
        parse_submission(_workload(None, [{"name": "main", "count": 1, "template": template}]))
    assert refused.value.problems[0][0] == (
        "spec.podSets[0].template.spec.containers[0].securityContext.allowPrivilegeEscalation"
    )
    typo = clean()
    typo["spec"]["containers"][0]["securityContext"]["privilegd"] = True
    with pytest.raises(SubmissionError) as refused:
        parse_submission(_workload(None, [{"name": "main", "count": 1, "template": typo}]))
    assert refused.value.problems == [
        ("spec.podSets[0].template.spec.containers[0].securityContext.privilegd", "unknown field")
    ]
