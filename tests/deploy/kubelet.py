"""Rendered pod templates run as local processes, roughly as a kubelet runs
them: init containers one after another to completion, then the containers.

A container's process gets the image's environment (the Containerfile's
``ENV``, its /opt/quartermaster/bin being this venv's bin and /tmp an
emptyDir of the pod's) and the manifest's ``env`` and ``envFrom``, with
ConfigMap values from the render and Secret values given by the test
(production's Secrets are the operator's); a missing non-optional Secret key
fails as ``CreateContainerConfigError`` would. Declared container ports are
rewritten to free local ones in the arguments and the probes, and 0.0.0.0 to
127.0.0.1. Each process runs in a session of its own, its working directory
the pod's stand-in for the read-only root filesystem, and is stopped with its
whole group.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from service.runtime.embedded import free_port
from service.runtime.supervisor import Child
from tests.deploy.manifests import Obj, containerfile, find
from tests.waiting import LONG_CEILING

VENV_BIN = str(Path(sys.executable).parent)


class ContainerConfigError(AssertionError):
    """What the kubelet would refuse to start (a Secret key that is not there)."""


@dataclass
class Pod:
    """One replica of a workload's pod template, started here."""

    name: str
    template: Obj
    tmp: Path
    root: Path
    ports: dict[int, int] = field(default_factory=dict)
    children: dict[str, Child] = field(default_factory=dict)

    def container(self, name: str) -> Obj:
        for kind in ("initContainers", "containers"):
            for container in self.template["spec"].get(kind) or ():
                if container["name"] == name:
                    return dict(container)
        raise KeyError(name)

    def port(self, reference: Any, container: Mapping[str, Any]) -> int:
        """The local port of a container port given by name or number."""
        for declared in container.get("ports") or ():
            if reference in (declared.get("name"), declared["containerPort"]):
                return self.ports[declared["containerPort"]]
        raise AssertionError(f"{container['name']}: no port {reference!r}")


class Kubelet:
    def __init__(
        self, objects: Sequence[Obj], secrets: Mapping[str, Mapping[str, str]], workdir: Path
    ) -> None:
        self.objects = list(objects)
        self.secrets = secrets
        self.workdir = workdir
        self.pods: list[Pod] = []
        self._image_env = _image_env()

    # -- starting ----------------------------------------------------------------------

    def pod(self, workload: Obj, replica: int = 0) -> Pod:
        """A replica of ``workload`` (nothing started yet)."""
        name = f"{workload['metadata']['name']}-{replica}"
        base = self.workdir / name
        pod = Pod(name, dict(workload["spec"]["template"]), base / "tmp", base / "root")
        pod.tmp.mkdir(parents=True)
        pod.root.mkdir(parents=True)
        for kind in ("initContainers", "containers"):
            for container in pod.template["spec"].get(kind) or ():
                for declared in container.get("ports") or ():
                    pod.ports[declared["containerPort"]] = free_port()
        self.pods.append(pod)
        return pod

    def start(self, pod: Pod, name: str) -> Child:
        container = pod.container(name)
        argv = [*(container.get("command") or ()), *(container.get("args") or ())]
        argv = [self._rewrite(arg, pod) for arg in argv]
        log = self.workdir / f"{pod.name}.{name}.log"
        with log.open("ab") as out:
            offset = out.tell()
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(pod, container),
                cwd=pod.root,
                start_new_session=True,
            )
        child = Child(f"{pod.name}/{name}", process, log, offset)
        pod.children[name] = child
        return child

    def run_inits(self, pod: Pod) -> None:
        """Every init container, in order, each to a successful exit."""
        for container in pod.template["spec"].get("initContainers") or ():
            child = self.start(pod, container["name"])
            code = child.process.wait(LONG_CEILING)
            assert code == 0, f"{child.name} exited {code}:\n{child.tail(30)}"

    def start_pod(self, pod: Pod) -> None:
        self.run_inits(pod)
        for container in pod.template["spec"]["containers"]:
            self.start(pod, container["name"])

    def _rewrite(self, arg: str, pod: Pod) -> str:
        if arg == "0.0.0.0":
            return "127.0.0.1"
        for declared, local in pod.ports.items():
            arg = re.sub(rf"(^|=){declared}$", rf"\g<1>{local}", arg)
        return arg

    # -- the environment ---------------------------------------------------------------

    def env(self, pod: Pod, container: Mapping[str, Any]) -> dict[str, str]:
        # /tmp first: this venv may itself lie under /tmp (a clone there).
        env = {k: v.replace("/tmp", str(pod.tmp)) for k, v in self._image_env.items()}
        env["PATH"] = env["PATH"].replace("/opt/quartermaster/bin", VENV_BIN)
        for source in container.get("envFrom") or ():
            if "configMapRef" in source:
                env.update(self._config_map(source["configMapRef"]["name"]))
            else:
                raise AssertionError(f"{container['name']}: envFrom {source} is not a ConfigMap")
        for entry in container.get("env") or ():
            value = self._value(pod, entry)
            if value is not None:
                env[entry["name"]] = value
        return env

    def _config_map(self, name: str) -> dict[str, str]:
        return dict(find(self.objects, "ConfigMap", name).get("data") or {})

    def _value(self, pod: Pod, entry: Mapping[str, Any]) -> str | None:
        if "value" in entry:
            return str(entry["value"])
        source = entry["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            data = self.secrets.get(ref["name"], {})
            if ref["key"] not in data:
                if ref.get("optional"):
                    return None
                raise ContainerConfigError(f"Secret {ref['name']} has no key {ref['key']}")
            return data[ref["key"]]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return self._config_map(ref["name"])[ref["key"]]
        if source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            return pod.name
        raise AssertionError(f"{entry['name']}: {source} is not supported here")

    # -- probes ------------------------------------------------------------------------

    def probe(self, pod: Pod, name: str, kind: str) -> bool:
        """Run the container's ``kind`` probe once (httpGet or exec)."""
        container = pod.container(name)
        spec = container[kind]
        timeout = max(float(spec.get("timeoutSeconds", 1)), 1.0) * 3  # a busy machine
        if "httpGet" in spec:
            http = spec["httpGet"]
            url = f"http://127.0.0.1:{pod.port(http['port'], container)}{http.get('path', '/')}"
            try:
                return 200 <= httpx.get(url, timeout=timeout).status_code < 400
            except httpx.HTTPError:
                return False
        if "exec" in spec:
            done = subprocess.run(
                spec["exec"]["command"],
                env=self.env(pod, container),
                cwd=pod.root,
                capture_output=True,
                timeout=timeout + 60,
                check=False,
            )
            return done.returncode == 0
        raise AssertionError(f"{name} {kind}: {spec} is not supported here")

    def passes(self, pod: Pod, name: str, kind: str) -> bool:
        """Whether the probe holds as the kubelet judges it: it fails only
        after ``failureThreshold`` failures in a row (tried a second apart)."""
        spec = pod.container(name)[kind]
        for attempt in range(int(spec.get("failureThreshold", 3))):
            if attempt:
                time.sleep(1)
            if self.probe(pod, name, kind):
                return True
        return False

    def logs(self, lines: int = 30) -> str:
        """The end of every container's output (for a failing test's message)."""
        return "\n".join(
            f"--- {c.name} ({'alive' if c.alive else c.process.returncode}):\n{c.tail(lines)}"
            for pod in self.pods
            for c in pod.children.values()
        )

    def until(self, pod: Pod, name: str, kind: str, ceiling: float = LONG_CEILING) -> None:
        """Probe until it succeeds, while the container lives."""
        child = pod.children[name]
        self._wait(lambda: self.probe(pod, name, kind), child, f"{child.name} {kind}", ceiling)

    @staticmethod
    def _wait(check: Callable[[], bool], child: Child, what: str, ceiling: float) -> None:
        deadline = time.monotonic() + ceiling
        while not check():
            if not child.alive:
                raise AssertionError(f"{child.name} exited:\n{child.tail(40)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {ceiling} s:\n{child.tail(40)}")
            time.sleep(0.5)

    # -- stopping ----------------------------------------------------------------------

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM every process group, SIGKILL what is left after ``grace``."""
        children = [c for pod in self.pods for c in pod.children.values()]
        for child in children:
            child.snapshot()
            _signal(child, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(c.alive or c.stragglers() for c in children):
            time.sleep(0.1)
        for child in children:
            _signal(child, signal.SIGKILL)
            for member in child.stragglers():
                with contextlib.suppress(Exception):  # gone meanwhile: nothing to kill
                    member.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(10)


def _signal(child: Child, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signum)


def _image_env() -> dict[str, str]:
    """The run stage's ENV (its venv's bin is made this one's per pod)."""
    return containerfile()[-1].env()
