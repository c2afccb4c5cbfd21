"""Policy over the rendered manifests.

For everything under deploy/: every pod template meets the floor we hold
tenants' pods to (service/app/floor.py: the restricted Pod Security Standard,
an image pinned by digest, its own service account), every container has a
read-only root filesystem, dropped capabilities and resources; a token is
mounted only for an identity that RBAC grants something; no RBAC rule says
``*``; every image is pinned by digest, ours the release's one. For the
central service: probes on every long-running container, /tmp writable, the
namespace enforcing the restricted profile, replicas as HA needs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from service.app.floor import check_pod, digest_problem
from service.app.schemas import SecurityPolicy
from tests.deploy.manifests import (
    DIGEST,
    IMAGE_NAME,
    OVERLAYS,
    Obj,
    component,
    containers,
    find,
    kustomizations,
    label,
    name_of,
    of_kind,
    pods,
    render,
    selects,
)

EVERYWHERE = pytest.mark.parametrize("path", kustomizations(), ids=label)
CENTRAL = pytest.mark.parametrize("overlay", sorted(OVERLAYS))
RBAC_KINDS = ("Role", "ClusterRole")
LONG_RUNNING = ("Deployment", "StatefulSet", "DaemonSet")


@EVERYWHERE
def test_every_pod_meets_the_restricted_floor(path: Path) -> None:
    found = []
    for workload, template in pods(render(path)):
        found += check_pod(template, name_of(workload), SecurityPolicy())
    assert found == []


@EVERYWHERE
def test_every_container_is_read_only_unprivileged_and_sized(path: Path) -> None:
    found = []
    for workload, template in pods(render(path)):
        pod_context = template["spec"].get("securityContext") or {}
        for kind, container in containers(template):
            where = f"{name_of(workload)} {kind}/{container['name']}"
            context = container.get("securityContext") or {}
            if context.get("readOnlyRootFilesystem") is not True:
                found.append(f"{where}: root filesystem not read-only")
            if context.get("allowPrivilegeEscalation") is not False:
                found.append(f"{where}: privilege escalation not refused")
            if "ALL" not in ((context.get("capabilities") or {}).get("drop") or ()):
                found.append(f"{where}: capabilities not all dropped")
            if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
                found.append(f"{where}: runs as root")
            resources = container.get("resources") or {}
            requests = resources.get("requests") or {}
            if not {"cpu", "memory"} <= set(requests):
                found.append(f"{where}: requests {sorted(requests)}, not cpu and memory")
            if "memory" not in (resources.get("limits") or {}):
                found.append(f"{where}: no memory limit")
    assert found == []


def _token_mounted(template: Mapping[str, Any], accounts: Mapping[str, Obj]) -> bool:
    spec = template["spec"]
    if "automountServiceAccountToken" in spec:
        return bool(spec["automountServiceAccountToken"])
    account = accounts.get(spec.get("serviceAccountName", "default")) or {}
    return bool(account.get("automountServiceAccountToken", True))


def _bound_accounts(objects: tuple[Obj, ...]) -> set[str]:
    return {
        subject["name"]
        for binding in objects
        if binding["kind"] in ("RoleBinding", "ClusterRoleBinding")
        for subject in binding.get("subjects") or ()
        if subject.get("kind") == "ServiceAccount"
    }


@EVERYWHERE
def test_a_token_is_mounted_only_for_an_identity_rbac_grants_something(path: Path) -> None:
    objects = render(path)
    accounts = {a["metadata"]["name"]: a for a in of_kind(objects, "ServiceAccount")}
    bound = _bound_accounts(objects)
    mounted = [
        (name_of(w), t["spec"].get("serviceAccountName", "default"))
        for w, t in pods(objects)
        if _token_mounted(t, accounts)
    ]
    assert [m for m in mounted if m[1] not in bound] == []


@EVERYWHERE
def test_no_rbac_rule_says_everything(path: Path) -> None:
    found = []
    for role in (o for o in render(path) if o["kind"] in RBAC_KINDS):
        for i, rule in enumerate(role.get("rules") or ()):
            for key in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
                if any("*" in value for value in rule.get(key) or ()):
                    found.append(f"{name_of(role)} rule {i}: {key} {rule[key]}")
    assert found == []


@EVERYWHERE
def test_every_image_is_pinned_by_digest_and_ours_is_the_releases(path: Path) -> None:
    ours = {c["image"] for _, c in containers(find_ours(render(OVERLAYS["production"])))}
    assert len(ours) == 1, ours
    found = []
    for workload, template in pods(render(path)):
        for _, container in containers(template):
            image = container["image"]
            problem = digest_problem(image) or (None if DIGEST.search(image) else "no sha256")
            if problem:
                found.append(f"{name_of(workload)}: {image}: {problem}")
            if f"/{IMAGE_NAME}/" in image and image not in ours:
                found.append(f"{name_of(workload)}: {image}, not the release's {ours}")
    assert found == []


def find_ours(objects: tuple[Obj, ...]) -> Obj:
    """The API's pod template, which runs our image."""
    template = find(list(objects), "Deployment", "quartermaster-api")["spec"]["template"]
    return dict(template)


# --- the central service ----------------------------------------------------------------


@CENTRAL
def test_the_namespace_enforces_the_restricted_profile(overlay: str) -> None:
    (namespace,) = of_kind(render(OVERLAYS[overlay]), "Namespace")
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    namespaced = {o["metadata"].get("namespace") for o in render(OVERLAYS[overlay])}
    assert namespaced == {None, namespace["metadata"]["name"]}


@CENTRAL
def test_every_long_running_container_has_probes_and_tmp_is_writable(overlay: str) -> None:
    found = []
    for workload, template in pods(render(OVERLAYS[overlay])):
        volumes = {v["name"]: v for v in template["spec"].get("volumes") or ()}
        for kind, container in containers(template):
            where = f"{name_of(workload)} {kind}/{container['name']}"
            probes = {
                p for p in ("livenessProbe", "readinessProbe", "startupProbe") if p in container
            }
            serving = kind == "containers" and workload["kind"] in LONG_RUNNING
            probed = "livenessProbe" in probes and probes & {"readinessProbe", "startupProbe"}
            if serving and not probed:
                found.append(f"{where}: probes {sorted(probes)}")
            if f"/{IMAGE_NAME}/" in container["image"]:
                tmp = [m for m in container.get("volumeMounts") or () if m["mountPath"] == "/tmp"]
                if not tmp or "emptyDir" not in volumes[tmp[0]["name"]]:
                    found.append(f"{where}: no emptyDir at /tmp")
    assert found == []


@CENTRAL
def test_replicas_and_disruption_budgets_keep_every_part_available(overlay: str) -> None:
    objects = render(OVERLAYS[overlay])
    deployments = {d["metadata"]["name"]: d for d in of_kind(objects, "Deployment")}
    scaled = {}
    for hpa in of_kind(objects, "HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment" and target["name"] in deployments
        assert "replicas" not in deployments[target["name"]]["spec"], (
            f"{target['name']}: the autoscaler owns its replicas; apply would reset them"
        )
        scaled[component(deployments[target["name"]])] = hpa["spec"]["minReplicas"]
    replicas = {component(d): d["spec"].get("replicas") for d in deployments.values()}
    assert scaled.keys() == {"api", "worker"}
    assert scaled["api"] >= 2 and scaled["worker"] >= 2
    assert replicas["scheduler"] == 2, "a leader and a standby"
    for name, deployment in deployments.items():
        rolling = deployment["spec"]["strategy"]["rollingUpdate"]
        assert rolling["maxUnavailable"] == 0, f"{name}: the old pods serve until the new are ready"
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        budgets = [
            b
            for b in of_kind(objects, "PodDisruptionBudget")
            if selects(b["spec"]["selector"], labels)
        ]
        assert len(budgets) == 1, f"{name}: {len(budgets)} disruption budgets"
        assert budgets[0]["spec"].get("maxUnavailable") == 1
        spread = deployment["spec"]["template"]["spec"].get("topologySpreadConstraints") or ()
        keys = {c["topologyKey"] for c in spread if selects(c["labelSelector"], labels)}
        assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}, name


def _port_names(template: Mapping[str, Any]) -> set[str | int]:
    found: set[str | int] = set()
    for _, container in containers(template):
        for port in container.get("ports") or ():
            found |= {port["containerPort"], port.get("name", "")}
    return found


@CENTRAL
def test_services_probes_and_monitors_find_their_pods_and_ports(overlay: str) -> None:
    objects = render(OVERLAYS[overlay])
    templates = [t for _, t in pods(objects)]
    found = []
    for service in of_kind(objects, "Service"):
        chosen = [
            t
            for t in templates
            if selects({"matchLabels": service["spec"]["selector"]}, t["metadata"]["labels"])
        ]
        if not chosen:
            found.append(f"{name_of(service)} selects no pod")
        for port in service["spec"]["ports"]:
            if any(port["targetPort"] not in _port_names(t) for t in chosen):
                found.append(f"{name_of(service)}: no port {port['targetPort']} on its pods")
    for template in templates:
        for _, container in containers(template):
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                http = (container.get(probe) or {}).get("httpGet")
                if http and http["port"] not in _port_names(template):
                    found.append(f"{container['name']} {probe}: no port {http['port']}")
    services = of_kind(objects, "Service")
    for monitor in of_kind(objects, "ServiceMonitor"):
        chosen = [
            s
            for s in services
            if selects(monitor["spec"]["selector"], s["metadata"].get("labels") or {})
        ]
        ports = {p.get("name") for s in chosen for p in s["spec"]["ports"]}
        if not chosen or any(e["port"] not in ports for e in monitor["spec"]["endpoints"]):
            found.append(
                f"{name_of(monitor)}: selects {[name_of(s) for s in chosen]}, ports {ports}"
            )
    for ingress in of_kind(objects, "Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                service = find(services, "Service", backend["name"])
                if backend["port"]["name"] not in {p.get("name") for p in service["spec"]["ports"]}:
                    found.append(f"{name_of(ingress)}: {backend}")
    assert found == []
