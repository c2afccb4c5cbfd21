"""Defaulting and validation of the built-in kinds, as their registry strategies do.

Only what a client can observe and our reconcilers depend on: the defaults the
API server fills in (so a desired-vs-actual diff sees what a real cluster
returns), the generated Job selector and labels, the immutability rules that
make a real update fail (a Job's pod template outside a suspended Job, a Pod's
spec), and the required fields whose absence is a 422.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from sim.kubesim.errors import Cause
from sim.kubesim.quantity import canonical_list
from sim.kubesim.selectors import match_selector_object
from sim.kubesim.store import clone

__all__ = ["STRATEGIES", "Strategy", "validate_metadata"]

Obj = dict[str, Any]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

_DEFAULT_TOLERATIONS = [
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
]


def _name_causes(name: str, *, label: bool) -> list[Cause]:
    pattern, limit = (_DNS_LABEL, 63) if label else (_DNS_SUBDOMAIN, 253)
    if len(name) > limit or not pattern.match(name):
        kind = "RFC 1123 label" if label else "RFC 1123 subdomain"
        return [
            Cause(
                "FieldValueInvalid",
                f'Invalid value: "{name}": a lowercase {kind} must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character",
                "metadata.name",
            )
        ]
    return []


@functools.lru_cache(maxsize=8192)
def _qualified_name_ok(key: str) -> bool:
    """Whether ``key`` is a qualified name (label and annotation keys: few, remembered)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


@functools.lru_cache(maxsize=8192)
def _label_value_ok(value: str) -> bool:
    return len(value) <= 63 and bool(_LABEL_VALUE.match(value))


def validate_metadata(obj: Obj, *, dns_label: bool = False) -> list[Cause]:
    """Name, labels and annotations checks every kind gets (``ValidateObjectMeta``)."""
    metadata = obj.get("metadata") or {}
    causes = _name_causes(metadata.get("name", ""), label=dns_label)
    for key, value in (metadata.get("labels") or {}).items():
        if not _qualified_name_ok(key):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{key}": name part must be valid',
                    "metadata.labels",
                )
            )
        if not isinstance(value, str) or not _label_value_ok(value):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {value!r}: a valid label must be an empty string or "
                    "consist of alphanumeric characters, '-', '_' or '.', and must start and "
                    "end with an alphanumeric character",
                    f"metadata.labels[{key}]",
                )
            )
    for key, value in (metadata.get("annotations") or {}).items():
        if not _qualified_name_ok(key) or not isinstance(value, str):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{key}": name part must be valid',
                    "metadata.annotations",
                )
            )
    return causes


class Strategy:
    """Per-kind hooks; the default does nothing (custom resources use their schema)."""

    def default(self, obj: Obj) -> None:
        """Fill in defaults (called on every write, like defaulting on decode)."""

    def prepare_create(self, obj: Obj) -> None:
        """Reset what a client may not set on create (usually ``status``)."""

    def validate(self, obj: Obj, old: Obj | None) -> list[Cause]:
        return []

    dns_label_names = False
    #: Whether ``metadata.generation`` is kept: custom resources and the kinds whose
    #: ``PrepareForCreate`` sets it (Jobs); Namespaces, Nodes, Events and (before
    #: v1.33) Pods have none.
    generation = True
    #: Whether a create keeps the client's ``status`` (a kubelet registers its Node with
    #: one); otherwise it is reset, as ``PrepareForCreate`` does with a status subresource.
    status_on_create = False


def _default_container(container: Obj) -> None:
    """``SetDefaults_Container``; quantities are decoded into canonical strings."""
    image = str(container.get("image", ""))
    tag = image.rsplit("/", 1)[-1]
    latest = ":" not in tag or tag.endswith(":latest")
    container.setdefault(
        "imagePullPolicy", "Always" if latest and "@" not in image else "IfNotPresent"
    )
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    resources = container.setdefault("resources", {})
    for port in container.get("ports") or ():
        port.setdefault("protocol", "TCP")
    for key in ("limits", "requests"):
        if key in resources:
            resources[key] = canonical_list(resources[key])


def _containers(spec: Obj) -> list[Obj]:
    return [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]


def default_pod_spec(spec: Obj) -> None:
    """``SetDefaults_PodSpec``: what a Pod and a pod template (in a Job) both get."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    if "overhead" in spec:
        spec["overhead"] = canonical_list(spec["overhead"])
    for container in _containers(spec):
        _default_container(container)


def _requests_from_limits(spec: Obj) -> None:
    """``SetDefaults_Pod``: a limit without a request is requested too — on Pods only,
    never on the pod template of a Job."""
    for container in _containers(spec):
        resources = container.get("resources") or {}
        if resources.get("limits"):
            requests = resources.setdefault("requests", {})
            for name, value in resources["limits"].items():
                requests.setdefault(name, value)


def _container_causes(spec: Obj, path: str) -> list[Cause]:
    containers = spec.get("containers")
    if not containers:
        return [Cause("FieldValueRequired", "Required value", f"{path}.containers")]
    causes = []
    names: set[str] = set()
    for index, container in enumerate(containers):
        where = f"{path}.containers[{index}]"
        name = container.get("name", "")
        if not name:
            causes.append(Cause("FieldValueRequired", "Required value", f"{where}.name"))
        elif name in names:
            causes.append(
                Cause("FieldValueDuplicate", f'Duplicate value: "{name}"', f"{where}.name")
            )
        names.add(name)
        if not container.get("image"):
            causes.append(Cause("FieldValueRequired", "Required value", f"{where}.image"))
    return causes


class NamespaceStrategy(Strategy):
    dns_label_names = True
    generation = False

    def default(self, obj: Obj) -> None:
        metadata = obj["metadata"]
        metadata.setdefault("labels", {})["kubernetes.io/metadata.name"] = metadata["name"]
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")

    def prepare_create(self, obj: Obj) -> None:
        obj["status"] = {"phase": "Active"}


class NodeStrategy(Strategy):
    generation = False
    status_on_create = True

    def default(self, obj: Obj) -> None:
        obj.setdefault("spec", {})
        status = obj.get("status") or {}
        for key in ("capacity", "allocatable"):
            if key in status:
                status[key] = canonical_list(status[key])


class PodStrategy(Strategy):
    generation = False

    def default(self, obj: Obj) -> None:
        spec = obj.setdefault("spec", {})
        default_pod_spec(spec)
        _requests_from_limits(spec)
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("serviceAccount", spec["serviceAccountName"])
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        spec.setdefault("priority", 0)
        tolerations = spec.setdefault("tolerations", [])
        for default in _DEFAULT_TOLERATIONS:
            if not any(t.get("key") == default["key"] for t in tolerations):
                tolerations.append(dict(default))

    def prepare_create(self, obj: Obj) -> None:
        self.default(obj)  # decoding defaults before PrepareForCreate computes the QoS class
        obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj.get("spec") or {})}

    def validate(self, obj: Obj, old: Obj | None) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes = _container_causes(spec, "spec")
        if old is not None:
            causes += _pod_spec_immutable(old.get("spec") or {}, spec)
        return causes


_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "schedulingGates", "nodeName")


def _pod_spec_immutable(old: Obj, new: Obj) -> list[Cause]:
    def comparable(spec: Obj) -> Obj:
        copy = {k: v for k, v in spec.items() if k not in _POD_MUTABLE}
        copy["containers"] = [
            {k: v for k, v in c.items() if k != "image"} for c in spec.get("containers") or ()
        ]
        return copy

    if comparable(old) != comparable(new):
        return [
            Cause(
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than "
                "`spec.containers[*].image`,`spec.initContainers[*].image`,"
                "`spec.activeDeadlineSeconds`,`spec.tolerations` "
                "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                "(allow it to be set to 1 if it was previously negative)",
                "spec",
            )
        ]
    return []


def _qos_class(spec: Obj) -> str:
    containers = spec.get("containers") or []
    resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        r.get("limits")
        and {k: r["limits"].get(k) for k in ("cpu", "memory")}
        == {k: (r.get("requests") or r["limits"]).get(k) for k in ("cpu", "memory")}
        and "cpu" in r["limits"]
        and "memory" in r["limits"]
        for r in resources
    )
    return "Guaranteed" if guaranteed else "Burstable"


class EventStrategy(Strategy):
    generation = False

    def validate(self, obj: Obj, old: Obj | None) -> list[Cause]:
        if not obj.get("involvedObject"):
            return [Cause("FieldValueRequired", "Required value", "involvedObject")]
        return []


_JOB_TEMPLATE_MUTABLE_WHEN_SUSPENDED = (
    "nodeSelector",
    "tolerations",
    "schedulingGates",
    "affinity",
)


class JobStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.setdefault("spec", {})
        if spec.get("parallelism") is None and spec.get("completions") is None:
            spec["completions"] = 1
        if spec.get("parallelism") is None:
            spec["parallelism"] = 1
        # SetDefaults_Job: a per-index backoff limit lifts the global one; a pod failure
        # policy needs pods replaced only once they have failed.
        per_index = spec.get("backoffLimitPerIndex") is not None
        spec.setdefault("backoffLimit", 2**31 - 1 if per_index else 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        failure_policy = spec.get("podFailurePolicy") is not None
        spec.setdefault(
            "podReplacementPolicy", "Failed" if failure_policy else "TerminatingOrFailed"
        )
        template = spec.setdefault("template", {})
        default_pod_spec(template.setdefault("spec", {}))
        uid = obj["metadata"].get("uid")
        if uid and not spec.get("manualSelector"):
            labels = template.setdefault("metadata", {}).setdefault("labels", {})
            name = obj["metadata"]["name"]
            generated = {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
            }
            for key, value in generated.items():
                labels.setdefault(key, value)
            spec.setdefault(
                "selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            )

    def prepare_create(self, obj: Obj) -> None:
        obj["status"] = {}

    def validate(self, obj: Obj, old: Obj | None) -> list[Cause]:
        spec = obj.get("spec") or {}
        template_spec = (spec.get("template") or {}).get("spec") or {}
        causes = _container_causes(template_spec, "spec.template.spec")
        restart = template_spec.get("restartPolicy")
        if restart not in ("Never", "OnFailure"):
            causes.append(
                Cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{restart}": supported values: "OnFailure", "Never"',
                    "spec.template.spec.restartPolicy",
                )
            )
        if old is not None:
            causes += _job_immutable(old.get("spec") or {}, spec)
        return causes


def _job_immutable(old: Obj, new: Obj) -> list[Cause]:
    causes = []
    if old.get("managedBy") != new.get("managedBy"):
        causes.append(
            Cause("FieldValueInvalid", "Invalid value: field is immutable", "spec.managedBy")
        )
    if old.get("selector") != new.get("selector"):
        causes.append(
            Cause("FieldValueInvalid", "Invalid value: field is immutable", "spec.selector")
        )
    if old.get("completions") != new.get("completions") and not (
        new.get("completionMode") == "Indexed" and new.get("completions") == new.get("parallelism")
    ):
        causes.append(
            Cause("FieldValueInvalid", "Invalid value: field is immutable", "spec.completions")
        )
    old_template, new_template = old.get("template") or {}, new.get("template") or {}
    if old_template != new_template and old.get("suspend") and new.get("suspend") is not None:
        old_template = _without_mutable(old_template)
        new_template = _without_mutable(new_template)
    if old_template != new_template:
        causes.append(
            Cause(
                "FieldValueInvalid",
                "Invalid value: field is immutable",
                "spec.template",
            )
        )
    return causes


def _without_mutable(template: Obj) -> Obj:
    copy = clone(template)
    metadata = copy.setdefault("metadata", {})
    metadata.pop("labels", None)
    metadata.pop("annotations", None)
    spec = copy.setdefault("spec", {})
    for key in _JOB_TEMPLATE_MUTABLE_WHEN_SUSPENDED:
        spec.pop(key, None)
    return copy


class _AppsStrategy(Strategy):
    """What Deployment, ReplicaSet and StatefulSet share (``pkg/apis/apps/validation``):
    one replica by default, a selector that selects the template's labels and never
    changes, a pod template whose pods restart ``Always``."""

    def default(self, obj: Obj) -> None:
        spec = obj.setdefault("spec", {})
        if spec.get("replicas") is None:
            spec["replicas"] = 1
        default_pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))

    def prepare_create(self, obj: Obj) -> None:
        obj["status"] = {}

    def validate(self, obj: Obj, old: Obj | None) -> list[Cause]:
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        causes = _container_causes(template.get("spec") or {}, "spec.template.spec")
        selector = spec.get("selector")
        labels = (template.get("metadata") or {}).get("labels") or {}
        if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
            causes.append(Cause("FieldValueRequired", "Required value", "spec.selector"))
        elif not match_selector_object(selector, labels):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {labels!r}: `selector` does not match template `labels`",
                    "spec.template.metadata.labels",
                )
            )
        replicas = spec.get("replicas", 1)
        if not isinstance(replicas, int) or replicas < 0:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {replicas}: must be greater than or equal to 0",
                    "spec.replicas",
                )
            )
        restart = (template.get("spec") or {}).get("restartPolicy")
        if restart != "Always":
            causes.append(
                Cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{restart}": supported values: "Always"',
                    "spec.template.spec.restartPolicy",
                )
            )
        if old is not None and (old.get("spec") or {}).get("selector") != selector:
            causes.append(
                Cause("FieldValueInvalid", "Invalid value: field is immutable", "spec.selector")
            )
        return causes


class DeploymentStrategy(_AppsStrategy):
    def default(self, obj: Obj) -> None:
        super().default(obj)
        spec = obj["spec"]
        spec.setdefault("revisionHistoryLimit", 10)
        strategy = spec.setdefault("strategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxUnavailable", "25%")
            rolling.setdefault("maxSurge", "25%")
        spec.setdefault("progressDeadlineSeconds", 600)


class StatefulSetStrategy(_AppsStrategy):
    def prepare_create(self, obj: Obj) -> None:
        # StatefulSetStatus' replicas and availableReplicas have no omitempty: always sent.
        obj["status"] = {"replicas": 0, "availableReplicas": 0}

    def default(self, obj: Obj) -> None:
        super().default(obj)
        spec = obj["spec"]
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("podManagementPolicy", "OrderedReady")
        update = spec.setdefault("updateStrategy", {})
        update.setdefault("type", "RollingUpdate")
        if update["type"] == "RollingUpdate":
            update.setdefault("rollingUpdate", {}).setdefault("partition", 0)
        spec.setdefault(
            "persistentVolumeClaimRetentionPolicy",
            {"whenDeleted": "Retain", "whenScaled": "Retain"},
        )


class ReplicaSetStrategy(_AppsStrategy):
    def prepare_create(self, obj: Obj) -> None:
        obj["status"] = {"replicas": 0}  # ReplicaSetStatus.replicas has no omitempty


STRATEGIES: dict[str, Callable[[], Strategy]] = {
    "namespaces": NamespaceStrategy,
    "nodes": NodeStrategy,
    "pods": PodStrategy,
    "events": EventStrategy,
    "jobs.batch": JobStrategy,
    "deployments.apps": DeploymentStrategy,
    "statefulsets.apps": StatefulSetStrategy,
    "replicasets.apps": ReplicaSetStrategy,
}
