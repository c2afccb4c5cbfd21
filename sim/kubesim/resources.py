"""The resource types the stand-in serves, and the Kueue CRDs they are read from.

Built-in kinds (core ``v1``, ``batch/v1``) and the job CRDs whose schemas we do
not have (JobSet, PyTorchJob, MPIJob) are declared here by hand; every Kueue kind
comes from the real CustomResourceDefinitions in ``../shared/kueue-crds`` read at
start-up, so served versions, scope, short names, printer columns and the
``openAPIV3Schema`` are exactly upstream's. A Volcano member serves Volcano's
kinds instead, from the copies of its CRDs in ``crds/`` (:func:`volcano_types`).
The CRD files carry no conversion webhook, so, as a real API server would with
``strategy: None``, one stored object is served at every version with only ``apiVersion`` rewritten.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.yamlcache import yaml_documents

__all__ = [
    "CRDS_ENV",
    "ResourceType",
    "ScalePaths",
    "Version",
    "builtin_types",
    "default_crds_dir",
    "kueue_types",
    "load_crd",
    "volcano_types",
    "workload_types",
]

CRDS_ENV = "QM_KUEUE_CRDS_DIR"

#: Kinds we serve from the Kueue CRD directory (the MultiKueue / provisioning ones are
#: loaded too when present: a real Kueue install has them, and they cost nothing).
KUEUE_GROUP = "kueue.x-k8s.io"
#: The Volcano kinds a Volcano member serves, from the project's copies of Volcano's
#: CRDs next to this module (provenance and sha256 in ``crds/README.md``).
VOLCANO_GROUPS = (
    "scheduling.volcano.sh",
    "batch.volcano.sh",
    "topology.volcano.sh",
    "bus.volcano.sh",
)
_PACKAGE_CRDS = Path(__file__).resolve().parent / "crds"
#: The workload kinds every member serves from the CRDs the project keeps for submissions
#: (``service/app/crds``, provenance and sha256 in its README): read as files, not imported.
WORKLOAD_GROUPS = ("ray.io", "leaderworkerset.x-k8s.io", "trainer.kubeflow.org")
#: The files of those kinds (the folder holds more: parsing is what a stand-in's start costs).
WORKLOAD_CRDS = (
    "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "ray.io_rayclusters.yaml",
    "ray.io_rayjobs.yaml",
    "trainer.kubeflow.org_trainjobs.yaml",
)
_WORKLOAD_CRDS = Path(__file__).resolve().parents[2] / "service" / "app" / "crds"


@dataclass(frozen=True, slots=True)
class ScalePaths:
    """A ``scale`` subresource: where the object keeps its replicas and pod selector
    (a CRD's ``subresources.scale``; ``spec.replicas``, ``status.replicas`` and the
    label selector ``spec.selector`` for the built-in apps/v1 kinds)."""

    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    label_selector: str | None = None


@dataclass(frozen=True, slots=True)
class Version:
    """One served version of a resource type."""

    name: str
    schema: Mapping[str, Any] | None = None
    printer_columns: tuple[Mapping[str, Any], ...] = ()
    deprecation_warning: str | None = None


@dataclass(frozen=True, slots=True)
class ResourceType:
    """A served resource: the unit of storage, RBAC, discovery and watch."""

    group: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    versions: tuple[Version, ...]
    storage_version: str
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    has_status: bool = True
    builtin: bool = False
    #: Extra field-selector paths beyond ``metadata.name`` / ``metadata.namespace``.
    field_selectors: tuple[str, ...] = ()
    scale: ScalePaths | None = None
    crd: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> str:
        """``plural.group`` (``pods`` for core): unique across the server."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    def version(self, name: str) -> Version | None:
        for version in self.versions:
            if version.name == name:
                return version
        return None

    def serves(self, version: str) -> bool:
        return self.version(version) is not None


def _core(
    kind: str,
    plural: str,
    *,
    namespaced: bool,
    short: tuple[str, ...] = (),
    status: bool = True,
    fields: tuple[str, ...] = (),
    group: str = "",
    version: str = "v1",
    categories: tuple[str, ...] = (),
    scale: ScalePaths | None = None,
) -> ResourceType:
    return ResourceType(
        group=group,
        kind=kind,
        plural=plural,
        singular=kind.lower(),
        namespaced=namespaced,
        versions=(Version(version),),
        storage_version=version,
        short_names=short,
        categories=categories,
        has_status=status,
        builtin=True,
        field_selectors=fields,
        scale=scale,
    )


_POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)


def _open_crd(
    group: str, version: str, kind: str, plural: str, short: tuple[str, ...]
) -> ResourceType:
    """A job CRD whose schema we do not ship: any fields, status subresource."""
    return ResourceType(
        group=group,
        kind=kind,
        plural=plural,
        singular=kind.lower(),
        namespaced=True,
        versions=(
            Version(
                version,
                {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            ),
        ),
        storage_version=version,
        short_names=short,
        categories=("all",),
    )


@functools.cache
def builtin_types() -> tuple[ResourceType, ...]:
    return (
        _core("Namespace", "namespaces", namespaced=False, short=("ns",), fields=("status.phase",)),
        _core("Node", "nodes", namespaced=False, short=("no",), fields=("spec.unschedulable",)),
        _core(
            "Pod", "pods", namespaced=True, short=("po",), fields=_POD_FIELDS, categories=("all",)
        ),
        _core(
            "Event", "events", namespaced=True, short=("ev",), status=False, fields=_EVENT_FIELDS
        ),
        _core(
            "Job",
            "jobs",
            namespaced=True,
            group="batch",
            fields=("status.successful",),
            categories=("all",),
        ),
        *_apps(),
        # The fence agent's heartbeat from the centre (workers/fence.py).
        _core("Lease", "leases", namespaced=True, group="coordination.k8s.io", status=False),
        # What a Volcano PodGroup's priorityClassName names (workers/plan/volcano.py).
        _core(
            "PriorityClass",
            "priorityclasses",
            namespaced=False,
            group="scheduling.k8s.io",
            short=("pc",),
            status=False,
        ),
        # What a member's admission rules are made of (deploy/member-volcano).
        _core(
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            namespaced=False,
            group="admissionregistration.k8s.io",
        ),
        _core(
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            namespaced=False,
            group="admissionregistration.k8s.io",
            status=False,
        ),
        _open_crd("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets", ()),
        _open_crd("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs", ()),
        _open_crd("kubeflow.org", "v2beta1", "MPIJob", "mpijobs", ()),
    )


#: apps/v1 keeps a workload's selector in ``spec.selector`` (a LabelSelector; the Scale
#: shows it as a string): ``labelSelector`` of :class:`ScalePaths` names that field.
_APPS_SCALE = ScalePaths(label_selector=".spec.selector")


def _apps() -> tuple[ResourceType, ...]:
    """Deployment, ReplicaSet and StatefulSet (apps/v1), each with a scale subresource."""
    return tuple(
        _core(
            kind,
            plural,
            namespaced=True,
            short=short,
            group="apps",
            categories=("all",),
            scale=_APPS_SCALE,
        )
        for kind, plural, short in (
            ("Deployment", "deployments", ("deploy",)),
            ("ReplicaSet", "replicasets", ("rs",)),
            ("StatefulSet", "statefulsets", ("sts",)),
        )
    )


def default_crds_dir(repo_root: Path | None = None) -> Path:
    """``$QM_KUEUE_CRDS_DIR``, else ``../shared/kueue-crds`` next to the
    repository root when it is there, else the copy shipped in this package
    (``sim/kubesim/crds``: the same files, so that a fresh clone runs alone)."""
    configured = os.environ.get(CRDS_ENV)
    if configured:
        return Path(configured)
    root = repo_root or Path(__file__).resolve().parents[2]
    shared = (root / ".." / "shared" / "kueue-crds").resolve()
    return shared if shared.is_dir() else Path(__file__).resolve().parent / "crds"


def load_crd(document: Mapping[str, Any]) -> ResourceType:
    """A :class:`ResourceType` from a ``CustomResourceDefinition`` document."""
    spec = document["spec"]
    names = spec["names"]
    versions: list[Version] = []
    storage = ""
    has_status = False
    scale: ScalePaths | None = None
    for entry in spec["versions"]:
        if not entry.get("served", True):
            continue
        subresources = entry.get("subresources") or {}
        if entry.get("storage"):
            storage = entry["name"]
            if "scale" in subresources:
                paths = subresources["scale"]
                scale = ScalePaths(
                    spec_replicas=paths["specReplicasPath"],
                    status_replicas=paths["statusReplicasPath"],
                    label_selector=paths.get("labelSelectorPath"),
                )
        has_status = has_status or "status" in subresources
        warning = entry.get("deprecationWarning")
        if entry.get("deprecated") and not warning:
            warning = f"{spec['group']}/{entry['name']} {names['kind']} is deprecated"
        versions.append(
            Version(
                name=entry["name"],
                schema=(entry.get("schema") or {}).get("openAPIV3Schema"),
                printer_columns=tuple(entry.get("additionalPrinterColumns") or ()),
                deprecation_warning=warning,
            )
        )
    return ResourceType(
        group=spec["group"],
        kind=names["kind"],
        plural=names["plural"],
        singular=names.get("singular") or names["kind"].lower(),
        namespaced=spec.get("scope") == "Namespaced",
        versions=tuple(versions),
        storage_version=storage or versions[-1].name,
        short_names=tuple(names.get("shortNames") or ()),
        categories=tuple(names.get("categories") or ()),
        has_status=has_status,
        scale=scale,
        crd=document,
    )


def _crd_documents(
    directory: Path, names: tuple[str, ...] | None = None
) -> Iterable[Mapping[str, Any]]:
    paths = [directory / n for n in names] if names else sorted(directory.glob("*.yaml"))
    for path in paths:
        for document in yaml_documents(path):  # parsed once per machine
            if isinstance(document, dict) and document.get("kind") == "CustomResourceDefinition":
                yield document


@functools.cache
def _types_cached(
    directory: str, _mtime: float, groups: tuple[str, ...], names: tuple[str, ...] | None = None
) -> tuple[ResourceType, ...]:
    documents = _crd_documents(Path(directory), names)
    return tuple(load_crd(doc) for doc in documents if doc["spec"]["group"] in groups)


def kueue_types(directory: Path | None = None) -> tuple[ResourceType, ...]:
    """Every CRD in ``directory`` (default :func:`default_crds_dir`), parsed once per process."""
    path = (directory or default_crds_dir()).resolve()
    if not path.is_dir():
        raise FileNotFoundError(
            f"Kueue CRD directory {path} not found; set {CRDS_ENV} or pass --crds-dir"
        )
    return _types_cached(str(path), path.stat().st_mtime, (KUEUE_GROUP,))


def volcano_types() -> tuple[ResourceType, ...]:
    """Volcano's Queue, PodGroup, Job and HyperNode, from the copies shipped in this
    package (the shared reference folder holds the same files, unmodified), and its
    Command (``bus.volcano.sh``), whose CRD is written here (``crds/README.md``)."""
    return _types_cached(str(_PACKAGE_CRDS), _PACKAGE_CRDS.stat().st_mtime, VOLCANO_GROUPS)


def workload_types() -> tuple[ResourceType, ...]:
    """RayJob, RayCluster, LeaderWorkerSet and TrainJob from the project's copies of their
    CRDs (the ones submissions are validated against), parsed once per process."""
    return _types_cached(
        str(_WORKLOAD_CRDS), _WORKLOAD_CRDS.stat().st_mtime, WORKLOAD_GROUPS, WORKLOAD_CRDS
    )
