"""A real uvicorn server on a free loopback port, over a migrated scratch
database; clients talk HTTP to it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import uvicorn

from service.api.app import create_app
from service.app.bootstrap import Services, bootstrap
from service.config import Settings
from service.runtime.embedded import free_port

ADMIN_TOKEN = "test-bootstrap-admin-token"


@contextmanager
def serve(
    database_url: str, server_options: dict[str, Any] | None = None, **overrides: Any
) -> Iterator[tuple[str, Services]]:
    settings = Settings(
        database_url=database_url,
        bootstrap_token=ADMIN_TOKEN,
        rate_limit_per_second=overrides.pop("rate_limit_per_second", 100_000),
        rate_limit_burst=overrides.pop("rate_limit_burst", 100_000),
        db_pool_size=4,
        **overrides,
    )
    services = bootstrap(settings)
    port = free_port()
    config = uvicorn.Config(
        create_app(services),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        **(server_options or {}),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the API server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", services
    finally:
        server.should_exit = True
        thread.join(10)
        services.close()


@pytest.fixture(scope="session")
def api_server(database_url: str) -> Iterator[tuple[str, Services]]:
    with serve(database_url) as served:
        yield served


class Api:
    """An HTTP client per role, against a database emptied for this test."""

    def __init__(self, base_url: str, services: Services) -> None:
        self.base_url = base_url
        self.services = services
        self.admin = self.client(ADMIN_TOKEN)
        self._clients: list[httpx.Client] = [self.admin]

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.Client(base_url=self.base_url, headers=headers, timeout=30)
        if hasattr(self, "_clients"):
            self._clients.append(client)
        return client

    def as_role(
        self, role: str, namespaces: list[str] | None = None, name: str | None = None
    ) -> httpx.Client:
        body = {
            "name": name or f"{role}-{len(self._clients)}",
            "role": role,
            "namespaces": namespaces or [],
        }
        response = self.admin.post("/v1/tokens", json=body)
        assert response.status_code == 201, response.text
        return self.client(response.json()["token"])

    def close(self) -> None:
        for client in self._clients:
            client.close()


@pytest.fixture
def api(api_server: tuple[str, Services], engine: sa.Engine) -> Iterator[Api]:
    base_url, services = api_server
    client = Api(base_url, services)
    yield client
    client.close()


def gpu_pod(
    image: str = "registry.example/train@sha256:" + "a" * 64, gpus: int = 8, **spec: Any
) -> dict[str, Any]:
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
                    "image": image,
                    "resources": {
                        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": gpus}
                    },
                }
            ],
            **spec,
        }
    }


def setup_quota(
    admin: httpx.Client,
    namespace: str = "team-a",
    cq: str = "cq-a",
    *,
    queue: str = "train",
    flavor: str = "h100",
    topology: str | None = None,
    **cq_spec: Any,
) -> None:
    """A flavor (of ``topology``, when named), a ClusterQueue with GPU quota,
    and a LocalQueue ``queue``."""
    flavor_spec: dict[str, Any] = {"nodeLabels": {"sku": "h100"}}
    if topology is not None:
        flavor_spec["topologyName"] = topology
    for response in (
        admin.post("/v1/resourceflavors", json={"metadata": {"name": flavor}, "spec": flavor_spec}),
        admin.post(
            "/v1/clusterqueues",
            json={
                "metadata": {"name": cq},
                "spec": {
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": flavor,
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": 512},
                                        {"name": "memory", "nominalQuota": "4Ti"},
                                        {"name": "nvidia.com/gpu", "nominalQuota": 64},
                                    ],
                                }
                            ],
                        }
                    ],
                    **cq_spec,
                },
            },
        ),
        admin.post(
            f"/v1/namespaces/{namespace}/localqueues",
            json={"metadata": {"name": queue}, "spec": {"clusterQueue": cq}},
        ),
    ):
        assert response.status_code in (201, 409), response.text


def workload(name: str, queue: str = "train", count: int = 2, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "quartermaster.dev/v1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "queueName": queue,
            "podSets": [{"name": "workers", "count": count, "template": gpu_pod()}],
            **spec,
        },
    }


ClientFactory = Callable[..., httpx.Client]
