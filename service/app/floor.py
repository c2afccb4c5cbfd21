"""The security floor: what every pod template a submission runs must meet.

The floor is the Kubernetes Pod Security Standards
(https://kubernetes.io/docs/concepts/security/pod-security-standards/) at
the ClusterQueue's ``securityPolicy.level`` — every control of the published
``baseline`` and ``restricted`` profiles, for containers, init containers and
ephemeral containers — plus our own rules: an image pinned by a parsed
digest, a service account other than ``default``, a runtime class for GPU
pods, and no ``nodeName`` (placement is the centre's). Templates are
type-checked against the Pod schema before they get here (a string is not a
boolean); the checks still read values exactly (only ``false`` is false).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from docker_image import reference

from service.app.schemas import SecurityPolicy

GPU = "nvidia.com/gpu"
CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")

#: Capabilities the baseline profile lets a container add.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
#: Sysctls the baseline profile allows (the "safe" set, v1.32).
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
#: Volume sources the restricted profile allows.
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"

Problem = tuple[str, str]


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _set(value: Any) -> bool:
    """A boolean field set to anything but false or nothing."""
    return value is not None and value is not False


class _Pod:
    """One pod template under check, with where its fields stand."""

    def __init__(self, template: Mapping[str, Any], path: str, policy: SecurityPolicy) -> None:
        self.spec = _map(template.get("spec"))
        self.annotations = _map(_map(template.get("metadata")).get("annotations"))
        self.path = path
        self.spec_path = f"{path}.spec" if path else "spec"
        self.policy = policy
        self.context = _map(self.spec.get("securityContext"))
        self.windows = _map(self.spec.get("os")).get("name") == "windows"
        self.problems: list[Problem] = []

    def add(self, path: str, message: str) -> None:
        self.problems.append((path, message))

    def containers(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        for key in CONTAINER_KINDS:
            for index, container in enumerate(_list(self.spec.get(key))):
                if isinstance(container, Mapping):
                    yield f"{self.spec_path}.{key}[{index}]", container

    @property
    def baseline(self) -> bool:
        return self.policy.level in ("baseline", "restricted")

    @property
    def restricted(self) -> bool:
        return self.policy.level == "restricted"


# -- Pod Security Standards: baseline ----------------------------------------------------


def _host_process(pod: _Pod) -> None:
    if _set(_map(pod.context.get("windowsOptions")).get("hostProcess")):
        pod.add(
            f"{pod.spec_path}.securityContext.windowsOptions.hostProcess",
            "Windows HostProcess pods are not allowed",
        )
    for path, container in pod.containers():
        context = _map(container.get("securityContext"))
        if _set(_map(context.get("windowsOptions")).get("hostProcess")):
            pod.add(
                f"{path}.securityContext.windowsOptions.hostProcess",
                "Windows HostProcess containers are not allowed",
            )


def _host_namespaces(pod: _Pod) -> None:
    if pod.policy.allowHostNetwork:
        return
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if _set(pod.spec.get(key)):
            pod.add(f"{pod.spec_path}.{key}", f"{key} is not allowed")


def _privileged(pod: _Pod) -> None:
    if pod.policy.allowPrivileged:
        return
    for path, container in pod.containers():
        if _set(_map(container.get("securityContext")).get("privileged")):
            pod.add(f"{path}.securityContext.privileged", "privileged containers are not allowed")


def _added_capabilities(pod: _Pod) -> None:
    for path, container in pod.containers():
        capabilities = _map(_map(container.get("securityContext")).get("capabilities"))
        for index, capability in enumerate(_list(capabilities.get("add"))):
            if capability not in BASELINE_CAPABILITIES:
                pod.add(
                    f"{path}.securityContext.capabilities.add[{index}]",
                    f"adding capability {capability!r} is not allowed",
                )


def _host_path(pod: _Pod) -> None:
    if pod.policy.allowHostPath:
        return
    for index, volume in enumerate(_list(pod.spec.get("volumes"))):
        if "hostPath" in _map(volume):
            pod.add(
                f"{pod.spec_path}.volumes[{index}].hostPath", "hostPath volumes are not allowed"
            )


def _host_ports(pod: _Pod) -> None:
    if pod.policy.allowHostNetwork:
        return
    for path, container in pod.containers():
        for index, port in enumerate(_list(container.get("ports"))):
            if _map(port).get("hostPort") not in (None, 0):
                pod.add(f"{path}.ports[{index}].hostPort", "host ports are not allowed")


def _apparmor(pod: _Pod) -> None:
    contexts = [(f"{pod.spec_path}.securityContext", pod.context)]
    contexts += [
        (f"{path}.securityContext", _map(c.get("securityContext"))) for path, c in pod.containers()
    ]
    for path, context in contexts:
        kind = _map(context.get("appArmorProfile")).get("type")
        if kind not in (None, "RuntimeDefault", "Localhost"):
            pod.add(f"{path}.appArmorProfile.type", f"AppArmor profile {kind!r} is not allowed")
    for key, value in pod.annotations.items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (
            value == "runtime/default" or str(value).startswith("localhost/")
        ):
            pod.add(
                f"{pod.path}.metadata.annotations.{key}".lstrip("."),
                f"AppArmor profile {value!r} is not allowed",
            )


def _selinux(pod: _Pod) -> None:
    contexts = [(f"{pod.spec_path}.securityContext", pod.context)]
    contexts += [
        (f"{path}.securityContext", _map(c.get("securityContext"))) for path, c in pod.containers()
    ]
    for path, context in contexts:
        options = _map(context.get("seLinuxOptions"))
        if options.get("type", "") not in SELINUX_TYPES:
            pod.add(
                f"{path}.seLinuxOptions.type", f"SELinux type {options['type']!r} is not allowed"
            )
        for key in ("user", "role"):
            if options.get(key):
                pod.add(f"{path}.seLinuxOptions.{key}", f"setting the SELinux {key} is not allowed")


def _proc_mount(pod: _Pod) -> None:
    for path, container in pod.containers():
        mount = _map(container.get("securityContext")).get("procMount")
        if mount not in (None, "Default"):
            pod.add(f"{path}.securityContext.procMount", f"procMount {mount!r} is not allowed")


def _seccomp_type(context: Mapping[str, Any]) -> Any:
    return _map(context.get("seccompProfile")).get("type")


def _seccomp(pod: _Pod) -> None:
    if _seccomp_type(pod.context) == "Unconfined":
        pod.add(
            f"{pod.spec_path}.securityContext.seccompProfile.type",
            "the Unconfined seccomp profile is not allowed",
        )
    for path, container in pod.containers():
        if _seccomp_type(_map(container.get("securityContext"))) == "Unconfined":
            pod.add(
                f"{path}.securityContext.seccompProfile.type",
                "the Unconfined seccomp profile is not allowed",
            )


def _sysctls(pod: _Pod) -> None:
    for index, sysctl in enumerate(_list(pod.context.get("sysctls"))):
        name = _map(sysctl).get("name")
        if name not in SAFE_SYSCTLS:
            pod.add(
                f"{pod.spec_path}.securityContext.sysctls[{index}].name",
                f"sysctl {name!r} is not in the safe set",
            )


# -- Pod Security Standards: restricted --------------------------------------------------


def _volume_types(pod: _Pod) -> None:
    # hostPath is the baseline's control (and its exemption allowHostPath).
    for index, volume in enumerate(_list(pod.spec.get("volumes"))):
        for source in sorted(set(_map(volume)) - {"name", "hostPath"} - RESTRICTED_VOLUMES):
            pod.add(
                f"{pod.spec_path}.volumes[{index}].{source}", f"{source} volumes are not allowed"
            )


def _privilege_escalation(pod: _Pod) -> None:
    if pod.policy.allowPrivilegeEscalation or pod.windows:
        return
    for path, container in pod.containers():
        if _map(container.get("securityContext")).get("allowPrivilegeEscalation") is not False:
            pod.add(
                f"{path}.securityContext.allowPrivilegeEscalation",
                "must be false: privilege escalation is not allowed",
            )


def _run_as_non_root(pod: _Pod) -> None:
    pod_level = pod.context.get("runAsNonRoot")
    if pod_level is not None and pod_level is not True:
        pod.add(f"{pod.spec_path}.securityContext.runAsNonRoot", "must be true")
    for path, container in pod.containers():
        value = _map(container.get("securityContext")).get("runAsNonRoot")
        if value is True or (value is None and pod_level is True):
            continue
        pod.add(
            f"{path}.securityContext.runAsNonRoot",
            "must be true (here or in the pod's securityContext)",
        )


def _run_as_user(pod: _Pod) -> None:
    if pod.context.get("runAsUser") == 0:
        pod.add(f"{pod.spec_path}.securityContext.runAsUser", "must not be 0 (root)")
    for path, container in pod.containers():
        if _map(container.get("securityContext")).get("runAsUser") == 0:
            pod.add(f"{path}.securityContext.runAsUser", "must not be 0 (root)")


def _seccomp_set(pod: _Pod) -> None:
    if pod.windows:
        return
    allowed = ("RuntimeDefault", "Localhost")
    pod_level = _seccomp_type(pod.context)
    for path, container in pod.containers():
        value = _seccomp_type(_map(container.get("securityContext")))
        if value in allowed or (value is None and pod_level in allowed):
            continue
        if value != "Unconfined":  # the baseline check names that one
            pod.add(
                f"{path}.securityContext.seccompProfile.type",
                "must be RuntimeDefault or Localhost (here or in the pod's securityContext)",
            )


def _dropped_capabilities(pod: _Pod) -> None:
    if pod.windows:
        return
    for path, container in pod.containers():
        capabilities = _map(_map(container.get("securityContext")).get("capabilities"))
        if "ALL" not in _list(capabilities.get("drop")):
            pod.add(f"{path}.securityContext.capabilities.drop", "must drop ALL capabilities")
        for index, capability in enumerate(_list(capabilities.get("add"))):
            if capability in BASELINE_CAPABILITIES and capability != "NET_BIND_SERVICE":
                pod.add(
                    f"{path}.securityContext.capabilities.add[{index}]",
                    f"adding capability {capability!r} is not allowed (only NET_BIND_SERVICE)",
                )


# -- our own rules -----------------------------------------------------------------------


def digest_problem(image: Any) -> str | None:
    """Why ``image`` is not a reference pinned by digest, or None: parsed by
    the distribution reference grammar, its digest an algorithm and a hex
    string of that algorithm's length."""
    if not isinstance(image, str) or not image:
        return "an image is required"
    try:
        parsed = reference.Reference.parse(image)
    except Exception as error:  # the library raises its own hierarchy
        return f"not an image reference ({error})"
    if not parsed["digest"]:
        return "the image must be pinned by digest (name@sha256:<64 hex digits>)"
    return None


def _images(pod: _Pod) -> None:
    if not pod.policy.requireImageDigest:
        return
    for path, container in pod.containers():
        problem = digest_problem(container.get("image"))
        if problem:
            pod.add(f"{path}.image", problem)


def _service_account(pod: _Pod) -> None:
    account = pod.spec.get("serviceAccountName") or pod.spec.get("serviceAccount") or "default"
    if pod.policy.forbidDefaultServiceAccount and account == "default":
        pod.add(
            f"{pod.spec_path}.serviceAccountName", "must name a service account other than default"
        )


def _uses_gpu(container: Mapping[str, Any]) -> bool:
    resources = _map(container.get("resources"))
    return any(GPU in _map(resources.get(part)) for part in ("requests", "limits", "claims"))


def _runtime_class(pod: _Pod) -> None:
    uses_gpu = any(_uses_gpu(container) for _, container in pod.containers())
    if pod.policy.requireRuntimeClassForGPU and uses_gpu and not pod.spec.get("runtimeClassName"):
        pod.add(f"{pod.spec_path}.runtimeClassName", "GPU pods must name a runtime class")


def _placement(pod: _Pod) -> None:
    if pod.spec.get("nodeName"):
        pod.add(f"{pod.spec_path}.nodeName", "must not be set: the centre places every pod")
    if _list(pod.spec.get("ephemeralContainers")):
        pod.add(
            f"{pod.spec_path}.ephemeralContainers",
            "ephemeral containers are not allowed in a pod template",
        )


BASELINE = (
    _host_process,
    _host_namespaces,
    _privileged,
    _added_capabilities,
    _host_path,
    _host_ports,
    _apparmor,
    _selinux,
    _proc_mount,
    _seccomp,
    _sysctls,
)
RESTRICTED = (
    _volume_types,
    _privilege_escalation,
    _run_as_non_root,
    _run_as_user,
    _seccomp_set,
    _dropped_capabilities,
)
OURS = (_images, _service_account, _runtime_class, _placement)


def check_pod(template: Mapping[str, Any], path: str, policy: SecurityPolicy) -> list[Problem]:
    """Every rule of ``policy`` that the pod template at ``path`` breaks."""
    pod = _Pod(template, path, policy)
    checks: tuple[Callable[[_Pod], None], ...] = OURS
    if pod.baseline:
        checks = BASELINE + checks
    if pod.restricted:
        checks = checks + RESTRICTED
    for check in checks:
        check(pod)
    return pod.problems


def violations(
    templates: Iterable[tuple[str, Mapping[str, Any]]], policy: SecurityPolicy
) -> list[Problem]:
    """Every rule broken by the pod templates given as (path, template)."""
    return [problem for path, t in templates for problem in check_pod(t, path, policy)]


_STRENGTH = {"privileged": 0, "baseline": 1, "restricted": 2}


def relaxations(before: SecurityPolicy, after: SecurityPolicy) -> list[str]:
    """The rules ``after`` enforces less than ``before``, by field name."""
    relaxed = []
    if _STRENGTH[after.level] < _STRENGTH[before.level]:
        relaxed.append(f"level: {before.level} -> {after.level}")
    for name in type(after).model_fields:
        if name == "level":
            continue
        old, new = getattr(before, name), getattr(after, name)
        weaker = (old and not new) if name.startswith(("require", "forbid")) else (new and not old)
        if weaker:
            relaxed.append(f"{name}: {old} -> {new}")
    return relaxed
