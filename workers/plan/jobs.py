"""The member job of a workload: its own manifest (every pod template as the
floor checked it), the JobSet a Volcano Job runs as on a Kueue member, or
one built from its pod sets, pinned to its islands."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from service.domain.jobs import SERVING_KINDS, VOLCANO_JOB, job_kind, job_pod_templates
from workers.plan.names import (
    ADMISSION_ID_ANNOTATION,
    ADMISSION_LABEL,
    API_VERSIONS,
    PRIORITY_ANNOTATION,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    RUN_KINDS,
    SIM_ANNOTATIONS,
    UID_ANNOTATION,
    USAGE_FINALIZER,
    WORKLOAD_ANNOTATION,
    WORKLOAD_LABEL,
    dns_label,
    job_name,
    managed_labels,
    priority_class_name,
    short_name,
    workload_label,
)
from workers.plan.views import WorkloadView

Obj = dict[str, Any]


def _pin(
    template: Mapping[str, Any],
    selector: Mapping[str, str],
    extra: Mapping[str, str],
    labels: Mapping[str, str],
    *,
    serving: bool = False,
) -> Obj:
    """A pod template pinned to its flavors' (and island's) node labels, its
    pods labelled with the workload and admission they belong to, and held
    by our finalizer until what they ran is read (workers/metering.py).

    ``serving``: a Deployment's, StatefulSet's or LeaderWorkerSet's, whose
    pods restart in place (their API refuses any ``restartPolicy`` but
    ``Always``) and go one by one as the object scales down: no finalizer
    (no one would lift it: their replicas' runs are the centre's, by
    admission and release, docs/serving.md) and no ``Never``."""
    # Copies of what changes only (metadata, its labels and annotations, the
    # spec's top level); the rest (containers, volumes) is shared with the
    # workload's spec, which nothing writes to: a deep copy of every
    # in-flight gang's template was a tenth of a reconcile pass.
    out = dict(template)
    meta = out["metadata"] = dict(out.get("metadata") or {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    if not serving:
        meta["finalizers"] = sorted({*(meta.get("finalizers") or ()), USAGE_FINALIZER})
    annotations = meta["annotations"] = dict(meta.get("annotations") or {})
    for key, value in extra.items():
        annotations.setdefault(key, value)
    spec = out["spec"] = dict(out.get("spec") or {})
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **selector}
    spec.setdefault("restartPolicy", "Always" if serving else "Never")
    return out


def _job_spec(count: int, template: Obj) -> Obj:
    return {
        "parallelism": count,
        "completions": count,
        "backoffLimit": 0,
        "template": template,
    }


def _templates(job: Obj) -> Iterable[tuple[str, Obj]]:
    """The pod templates of a job manifest of any supported kind, each with
    the name of its pod set: the very list the security floor checked and
    the submission was charged for (service/domain/jobs.py)."""
    found, _ = job_pod_templates(job)
    for template in found:
        if isinstance(template.template, dict):
            yield template.name, template.template


def job_kinds(specs: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The kinds of the member jobs of workloads with these specs (as
    :func:`member_job` builds them), and always ``Job``: what a pass that does not
    look for strays lists."""
    used = {"Job"}
    for spec in specs:
        source = spec.get("job")
        if isinstance(source, Mapping) and job_kind(source) == VOLCANO_JOB:
            used.add("JobSet")
        elif isinstance(source, Mapping) and source.get("kind") in RUN_KINDS:
            used.add(str(source["kind"]))
        elif len(list(spec.get("podSets") or ())) != 1:
            used.add("JobSet")
    return tuple(k for k in RUN_KINDS if k in used)


def member_job(
    workload: WorkloadView,
    queue: str,
    selectors: Mapping[str, Mapping[str, str]],
    admission: str,
) -> Obj:
    """The member job of ``workload``, each pod set pinned by its own
    selector (pod sets of one gang may sit in different islands), its
    priority the member's Kueue sees."""
    first = next(iter(selectors.values()), {})
    meta: Obj = {
        "name": job_name(workload),
        "namespace": workload.namespace,
        "labels": managed_labels(
            **{
                WORKLOAD_LABEL: workload_label(workload.namespace, workload.name),
                ADMISSION_LABEL: admission,
                QUEUE_LABEL: queue,
                PRIORITY_LABEL: priority_class_name(priority_of(workload)),
            }
        ),
        "annotations": {
            WORKLOAD_ANNOTATION: workload.key,
            UID_ANNOTATION: workload.uid,
            PRIORITY_ANNOTATION: str(workload.spec.get("priority") or 0),
            ADMISSION_ID_ANNOTATION: str(workload.admission.get("id") or ""),
        },
    }
    sim = {k: str(v) for k, v in workload.annotations.items() if k in SIM_ANNOTATIONS}
    if workload.admission.get("id"):
        sim[ADMISSION_ID_ANNOTATION] = str(workload.admission["id"])
    pods = {k: meta["labels"][k] for k in (WORKLOAD_LABEL, ADMISSION_LABEL)}
    source = workload.spec.get("job")
    if isinstance(source, Mapping) and job_kind(source) == VOLCANO_JOB:
        pinned = {
            name: _pin(template, selectors.get(name, first), sim, pods)
            for name, template in _templates(dict(source))
        }
        return volcano_jobset(source, meta, pinned)
    if isinstance(source, Mapping) and source.get("kind") in RUN_KINDS:
        job = copy.deepcopy(dict(source))
        original = job.get("metadata") or {}
        meta["labels"] = {**(original.get("labels") or {}), **meta["labels"]}
        meta["annotations"] = {**(original.get("annotations") or {}), **meta["annotations"]}
        job["metadata"] = meta
        job.pop("status", None)
        serving = job.get("kind") in SERVING_KINDS  # a StatefulSet admitted as one gang
        for name, template in _templates(job):
            pinned = _pin(template, selectors.get(name, first), sim, pods, serving=serving)
            template.update(pinned)
        return job
    pod_sets = list(workload.spec.get("podSets") or ())
    if len(pod_sets) == 1:
        ps = pod_sets[0]
        return {
            "apiVersion": API_VERSIONS["Job"],
            "kind": "Job",
            "metadata": meta,
            "spec": _job_spec(
                int(ps["count"]),
                _pin(
                    ps.get("template") or {}, selectors.get(str(ps.get("name")), first), sim, pods
                ),
            ),
        }
    return {
        "apiVersion": API_VERSIONS["JobSet"],
        "kind": "JobSet",
        "metadata": meta,
        "spec": {
            "replicatedJobs": [
                {
                    "name": short_name(dns_label(str(ps.get("name", f"set-{i}"))), 40),
                    "replicas": 1,
                    "template": {
                        "spec": _job_spec(
                            int(ps["count"]),
                            _pin(
                                ps.get("template") or {},
                                selectors.get(str(ps.get("name")), first),
                                sim,
                                pods,
                            ),
                        )
                    },
                }
                for i, ps in enumerate(pod_sets)
            ]
        },
    }


def volcano_jobset(job: Mapping[str, Any], meta: Obj, pinned: Mapping[str, Obj]) -> Obj:
    """A Volcano Job as the JobSet a Kueue member runs (docs/volcano.md): one
    replicated job per task of pods, an Indexed Job of its ``replicas`` pods
    (the index Volcano gives as ``VK_TASK_INDEX``), each from the task's
    template as the floor checked it (``pinned``, by task name); a task
    whose completion completes the Volcano Job is the JobSet's success
    target. Tasks of no pod run nothing and are left out."""
    found, _ = job_pod_templates(job)
    tasks = {task.name: task for task in found if task.count > 0 and task.name in pinned}
    names = {name: short_name(dns_label(name), 40) for name in tasks}
    spec: Obj = {
        "replicatedJobs": [
            {
                "name": names[name],
                "replicas": 1,
                "template": {
                    "spec": {
                        **_job_spec(task.count, _kueue_scheduled(pinned[name])),
                        "completionMode": "Indexed",
                    }
                },
            }
            for name, task in tasks.items()
        ]
    }
    volcano = _mapping(job.get("spec"))
    every = _ends_job(volcano.get("policies"))
    ending = [
        names[name]
        for i, raw in enumerate(volcano.get("tasks") or ())
        if (name := str(_mapping(raw).get("name") or f"default{i}")) in names
        and (every or _ends_job(_mapping(raw).get("policies")))
    ]
    if ending:
        spec["successPolicy"] = {"operator": "Any", "targetReplicatedJobs": ending}
    original = _mapping(job.get("metadata"))
    return {
        "apiVersion": API_VERSIONS["JobSet"],
        "kind": "JobSet",
        "metadata": {
            **meta,
            "labels": {**(original.get("labels") or {}), **meta["labels"]},
            "annotations": {**(original.get("annotations") or {}), **meta["annotations"]},
        },
        "spec": spec,
    }


def _ends_job(policies: Any) -> bool:
    """Whether Volcano policies complete the job when a task completes
    (``event``/``events: TaskCompleted``, ``action: CompleteJob``): on a
    JobSet, that task is a success target."""
    for raw in policies if isinstance(policies, list) else ():
        policy = _mapping(raw)
        events = [policy.get("event"), *(policy.get("events") or ())]
        if "TaskCompleted" in events and policy.get("action") == "CompleteJob":
            return True
    return False


def _kueue_scheduled(template: Obj) -> Obj:
    """A task's template without ``schedulerName: volcano``: no Volcano
    scheduler binds pods on a Kueue member (they would wait for ever)."""
    spec = template.get("spec") or {}
    if spec.get("schedulerName") != "volcano":
        return template
    return {**template, "spec": {k: v for k, v in spec.items() if k != "schedulerName"}}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def priority_of(workload: WorkloadView) -> int:
    return int(workload.spec.get("priority") or 0)
