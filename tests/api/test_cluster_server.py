"""A Cluster's spec.server is shown to every reader and kept in the ledger
for good: credentials typed into it are refused, naming the field."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api
from tests.api.test_resources import _fields, _problem


@pytest.mark.parametrize(
    "server",
    [
        "https://admin:s3cret@10.0.0.1:6443",
        "https://token@api.example:6443",
        "https://api.example:6443/?token=s3cret",
        "https://api.example:6443/path?access_token=x",
        "https://api.example:6443/#s3cret",
    ],
)
def test_credentials_in_the_server_url_are_refused(api: Api, server: str) -> None:
    body = {
        "metadata": {"name": "east"},
        "spec": {"server": server, "credentials": {"token": "t"}},
    }
    problem = _problem(api.admin.post("/v1/clusters", json=body), 422, "invalid")
    assert _fields(problem) == ["spec.server"]
    assert "s3cret" not in str(problem)
    assert api.admin.get("/v1/clusters/east").status_code == 404


def test_a_plain_server_url_is_accepted(api: Api) -> None:
    body = {
        "metadata": {"name": "east"},
        "spec": {"server": "https://api.example:6443/k8s", "credentials": {"token": "t"}},
    }
    assert api.admin.post("/v1/clusters", json=body).status_code == 201


@pytest.mark.parametrize("backend", ["slurm", "Volcano", 1, ""])
def test_a_backend_other_than_kueue_or_volcano_is_refused_naming_the_field(
    api: Api, backend: object
) -> None:
    body = {
        "metadata": {"name": "east"},
        "spec": {
            "server": "https://api.example:6443",
            "backend": backend,
            "credentials": {"token": "t"},
        },
    }
    problem = _problem(api.admin.post("/v1/clusters", json=body), 422, "invalid")
    assert _fields(problem) == ["spec.backend"]
    assert api.admin.get("/v1/clusters/east").status_code == 404


@pytest.mark.parametrize("backend", ["kueue", "volcano"])
def test_a_backend_named_in_the_registration_is_kept(api: Api, backend: str) -> None:
    body = {
        "metadata": {"name": "east"},
        "spec": {
            "server": "https://api.example:6443",
            "backend": backend,
            "credentials": {"token": "t"},
        },
    }
    assert api.admin.post("/v1/clusters", json=body).status_code == 201
    assert api.admin.get("/v1/clusters/east").json()["spec"]["backend"] == backend
