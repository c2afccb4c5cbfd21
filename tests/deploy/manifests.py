"""The deploy manifests as the tests read them: every kustomization under
``deploy/`` rendered by ``kubectl kustomize`` (kustomize v5; ``.ci/run``
installs a kubectl that has it), the objects' pod templates and containers,
label selectors as Kubernetes reads them, and the image's Containerfile.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CENTRAL = DEPLOY / "central"
OVERLAYS = {"dev": CENTRAL / "overlays" / "dev", "production": CENTRAL / "overlays" / "production"}
CONTAINERFILE = DEPLOY / "image" / "Containerfile"
#: The image the central parts and the fence agent run (kustomize ``images:`` name).
IMAGE_NAME = "quartermaster"
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")

Obj = dict[str, Any]


def kustomizations() -> list[Path]:
    """Every directory under deploy/ that kustomize can render."""
    return sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))


def label(path: Path) -> str:
    return str(path.relative_to(DEPLOY))


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is not on PATH: `bash .ci/run` installs one (kustomize v5)")
    return found


@functools.cache
def render(path: Path) -> tuple[Obj, ...]:
    """``kubectl kustomize path``, every object once (cached per process)."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"kubectl kustomize {label(path)}:\n{done.stderr}"
    return tuple(o for o in yaml.safe_load_all(done.stdout) if o)


def name_of(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def find(objects: Sequence[Obj], kind: str, name: str) -> Obj:
    """The object of that kind whose name is ``name`` (or, for generated
    Secrets and ConfigMaps, ``name`` and kustomize's hash suffix)."""
    for obj in objects:
        if obj["kind"] == kind and re.fullmatch(
            rf"{name}(-[a-z0-9]{{10}})?", obj["metadata"]["name"]
        ):
            return obj
    raise AssertionError(f"no {kind}/{name} in the render")


def of_kind(objects: Sequence[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


# --- pods ---------------------------------------------------------------------------------

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")
CONTAINER_LISTS = ("initContainers", "containers")


def pod_template(obj: Mapping[str, Any]) -> Obj | None:
    if obj["kind"] == "CronJob":
        return dict(obj["spec"]["jobTemplate"]["spec"]["template"])
    if obj["kind"] in WORKLOAD_KINDS:
        return dict(obj["spec"]["template"])
    return None


def pods(objects: Sequence[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(workload, its pod template) for every workload object."""
    for obj in objects:
        template = pod_template(obj)
        if template is not None:
            yield obj, template


def containers(template: Mapping[str, Any]) -> Iterator[tuple[str, Obj]]:
    """(``initContainers`` or ``containers``, container) of a pod template."""
    for kind in CONTAINER_LISTS:
        for container in template["spec"].get(kind) or ():
            yield kind, container


def component(obj: Mapping[str, Any]) -> str:
    """The part a workload runs (``app.kubernetes.io/component`` of its pods)."""
    template = pod_template(obj)
    assert template is not None
    return str(template["metadata"]["labels"]["app.kubernetes.io/component"])


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a Kubernetes label selector matches ``labels`` (an empty
    selector matches everything)."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or ()
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


# --- the Containerfile ----------------------------------------------------------------------


@dataclass
class Stage:
    """One ``FROM`` of the Containerfile and its instructions, in order."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for key, args in self.instructions if key == keyword]

    def env(self) -> dict[str, str]:
        """The ``ENV key=value …`` of this stage (values without quotes or spaces)."""
        found: dict[str, str] = {}
        for args in self.all("ENV"):
            for pair in args.split():
                key, _, value = pair.partition("=")
                found[key] = value
        return found

    def exec_form(self, keyword: str) -> list[str] | None:
        """The last ``keyword`` (ENTRYPOINT, CMD) if in exec (JSON) form, else None."""
        values = self.all(keyword)
        if not values:
            return None
        try:
            parsed = json.loads(values[-1])
        except json.JSONDecodeError:
            return None
        return [str(p) for p in parsed] if isinstance(parsed, list) else None


def _logical_lines(text: str) -> Iterator[str]:
    line = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not line and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            line += stripped[:-1] + " "
            continue
        yield line + stripped
        line = ""
    if line:
        yield line


def containerfile(path: Path = CONTAINERFILE) -> list[Stage]:
    """The stages of a Containerfile, its global ``ARG``s substituted into ``FROM``."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(path.read_text(encoding="utf-8")):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key] = value
        elif keyword == "FROM":
            words = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest).split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest))
    return stages
