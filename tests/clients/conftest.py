"""The live API (a uvicorn server over a migrated scratch database, from
tests/api) and SDK clients against it; every test starts from an empty
database."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from quartermaster_client import Client, RetryPolicy

from service.app.bootstrap import Services
from tests.api.conftest import ADMIN_TOKEN, serve

FAST_RETRIES = RetryPolicy(attempts=5, backoff=0.01, max_backoff=0.05)
DIGEST_IMAGE = "registry.example/train@sha256:" + "a" * 64


@pytest.fixture(scope="session")
def served(database_url: str) -> Iterator[tuple[str, Services]]:
    with serve(database_url) as (url, services):
        yield url, services


@pytest.fixture(scope="session")
def api_url(served: tuple[str, Services]) -> str:
    return served[0]


@pytest.fixture
def qm(api_url: str, engine: sa.Engine) -> Iterator[Client]:
    """An admin client on an emptied database."""
    with Client(api_url, ADMIN_TOKEN, retry=FAST_RETRIES) as client:
        yield client


def gpu_pod(gpus: int = 8) -> dict[str, Any]:
    """A pod template that meets the default security floor."""
    return {
        "spec": {
            "serviceAccountName": "trainer",
            "runtimeClassName": "nvidia",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "image": DIGEST_IMAGE,
                    "resources": {
                        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": gpus}
                    },
                }
            ],
        }
    }


def workload(name: str, queue: str = "train", count: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "queueName": queue,
            "podSets": [{"name": "workers", "count": count, "template": gpu_pod()}],
        },
    }


def job(name: str, parallelism: int = 2, queue: str = "train") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {"parallelism": parallelism, "completions": parallelism, "template": gpu_pod(2)},
    }


def setup_quota(client: Client, namespace: str = "team-a", cq: str = "cq-a") -> None:
    """Flavor h100, ClusterQueue ``cq`` with 64 GPUs, LocalQueue ``train``."""
    client.resourceflavors.apply(
        {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"sku": "h100"}}}
    )
    quotas = [
        {"name": "cpu", "nominalQuota": 512},
        {"name": "memory", "nominalQuota": "4Ti"},
        {"name": "nvidia.com/gpu", "nominalQuota": 64},
    ]
    client.clusterqueues.apply(
        {
            "metadata": {"name": cq},
            "spec": {
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [{"name": "h100", "resources": quotas}],
                    }
                ]
            },
        }
    )
    client.localqueues.apply(
        {"metadata": {"name": "train"}, "spec": {"clusterQueue": cq}}, namespace=namespace
    )
