"""Registering a member in two commands: ``qmctl cluster from-kubeconfig``
turns a stand-in's kubeconfig context and the workers' token Secret into
the Cluster object, ``qmctl apply -f`` sends it, and the workers — holding
only deploy/member's rules there — find the member Ready. And the other
sources of credentials, and what the command refuses."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import sqlalchemy as sa
import yaml
from quartermaster_client.cli import app
from typer.testing import CliRunner

from service.app.schemas import ClusterSpec
from sim.kubesim.testing import RunningCluster
from tests.api.conftest import ADMIN_TOKEN, serve
from tests.deploy.member_world import WORKERS, rendered, workers_rules
from tests.waiting import wait_for
from tests.workers.conftest import worker_settings
from tests.workers.members import members, scheduling, settings
from workers.celery_app import make_celery
from workers.tasks import sender

QMCTL = [sys.executable, "-m", "quartermaster_client.cli"]
PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def _secret(token: str, ca_pem: bytes) -> dict[str, Any]:
    """The workers' token Secret as the member's token controller fills it
    in and ``kubectl get secret -o yaml`` prints it."""

    def b64(value: bytes) -> str:
        return base64.b64encode(value).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {
            "name": "quartermaster-workers-token",
            "namespace": "quartermaster-system",
            "annotations": {"kubernetes.io/service-account.name": "quartermaster-workers"},
        },
        "data": {
            "ca.crt": b64(ca_pem),
            "namespace": b64(b"quartermaster-system"),
            "token": b64(token.encode()),
        },
    }


def _qmctl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QMCTL, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def member(tmp_path: Path) -> Iterator[RunningCluster]:
    with members(tmp_path) as (c1,):
        yield c1


def test_two_commands_register_a_member_that_the_workers_then_find_ready(
    engine: sa.Engine, database_url: str, redis_url: str, member: RunningCluster, tmp_path: Path
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    assert member.ca_file is not None
    token = member.add_user(WORKERS, workers_rules(rendered()))
    secret = tmp_path / "secret.yaml"
    secret.write_text(yaml.safe_dump(_secret(token, member.ca_file.read_bytes())))
    cluster_yaml = tmp_path / "cluster.yaml"
    with serve(database_url) as (url, _):
        made = _qmctl(
            "cluster",
            "from-kubeconfig",
            *("--kubeconfig", str(member.kubeconfig), "--kube-context", member.context),
            *("--name", "east-1", "--secret", str(secret), "--label", "region=east"),
        )
        assert made.returncode == 0, made.stderr
        cluster_yaml.write_text(made.stdout)
        applied = _qmctl("--server", url, "--token", ADMIN_TOKEN, "apply", "-f", str(cluster_yaml))
        assert applied.returncode == 0, applied.stderr
        assert "cluster/east-1 created" in applied.stdout
        celery = make_celery(worker_settings(database_url, redis_url))
        try:
            with scheduling(engine, settings(database_url, redis_url), sender(celery)):
                api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                with api:

                    def ready() -> dict[str, Any] | None:
                        body: dict[str, Any] = api.get("/v1/clusters/east-1").json()
                        status = body.get("status") or {}
                        heard = status.get("lastHeartbeat")
                        return body if status.get("state") == "Ready" and heard else None

                    shown = wait_for(ready, 60, "east-1 Ready")
        finally:
            celery.close()
    obj = yaml.safe_load(made.stdout)
    assert obj["spec"]["server"] == member.url
    assert obj["spec"]["credentials"] == {"token": token}
    assert base64.b64decode(obj["spec"]["caData"]) == member.ca_file.read_bytes()
    assert "east-1" in made.stderr and "quartermaster-system/quartermaster-workers-token" in (
        made.stderr
    )
    assert shown["metadata"]["labels"] == {"region": "east"}
    assert "credentials" not in shown["spec"] and token not in json.dumps(shown)
    # The workers reached it with the workers' token, and were refused nothing.
    audit = member.audit(WORKERS)
    assert audit and not [r for r in audit if r.denied]


def _run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["cluster", "from-kubeconfig", *args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_without_a_secret_it_takes_the_contexts_own_user(member: RunningCluster) -> None:
    code, out, _ = _run(
        "--kubeconfig", str(member.kubeconfig), "--kube-context", member.context, "--name", "c1"
    )
    assert code == 0
    obj = yaml.safe_load(out)
    config = yaml.safe_load(member.kubeconfig.read_text())
    (cluster,) = config["clusters"]
    assert obj["spec"] == {
        "server": member.url,
        "caData": cluster["cluster"]["certificate-authority-data"],
        "credentials": {"token": member.token},
    }
    ClusterSpec.model_validate(obj["spec"])


def _kubeconfig(tmp_path: Path, user: dict[str, Any], server: str = "https://m.example") -> Path:
    (tmp_path / "ca.crt").write_text(PEM)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "m", "cluster": {"server": server, "certificate-authority": "ca.crt"}}
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "m", "context": {"cluster": "m", "user": "u"}}],
        "current-context": "m",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_client_certificate_user_is_embedded_as_a_kubeconfig_with_its_files_inlined(
    tmp_path: Path,
) -> None:
    (tmp_path / "client.crt").write_text(PEM)
    (tmp_path / "client.key").write_text("-----BEGIN EC PRIVATE KEY-----\nx\n")
    user = {"client-certificate": "client.crt", "client-key": "client.key"}
    code, out, err = _run("--kubeconfig", str(_kubeconfig(tmp_path, user)), "--name", "m")
    assert code == 0, err
    spec = yaml.safe_load(out)["spec"]
    assert spec["server"] == "https://m.example"
    assert base64.b64decode(spec["caData"]).decode() == PEM
    embedded = yaml.safe_load(spec["credentials"]["kubeconfig"])
    assert embedded["current-context"] == "m"
    (u,) = embedded["users"]
    assert set(u["user"]) == {"client-certificate-data", "client-key-data"}
    assert base64.b64decode(u["user"]["client-certificate-data"]).decode() == PEM
    (c,) = embedded["clusters"]
    assert "certificate-authority" not in c["cluster"]
    ClusterSpec.model_validate(spec)


def test_a_token_file_and_a_ca_file_need_no_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text(PEM)
    code, out, err = _run(
        *("--server", "https://east.example:6443/", "--token-file", "-"),
        *("--ca-file", str(tmp_path / "ca.crt"), "--name", "east-1", "-o", "json"),
        stdin="a-token\n",
    )
    assert code == 0, err
    spec = json.loads(out)["spec"]
    assert spec == {
        "server": "https://east.example:6443",
        "caData": base64.b64encode(PEM.encode()).decode(),
        "credentials": {"token": "a-token"},
    }


@pytest.mark.parametrize(
    ("args", "user", "said"),
    [
        (["--server", "https://admin:pw@east.example"], {"token": "t"}, "spec.server"),
        (["--server", "https://east.example/?token=t"], {"token": "t"}, "spec.server"),
        ([], {"exec": {"command": "aws"}}, "exec plugin"),
        ([], {"username": "admin", "password": "pw"}, "no token or client certificate"),
        (["--kube-context", "nope"], {"token": "t"}, "no context named 'nope'"),
        (["-o", "table"], {"token": "t"}, "expected yaml or json"),
        (["--label", "novalue"], {"token": "t"}, "expected key=value"),
    ],
    ids=["userinfo", "query", "exec", "basic-auth", "context", "output", "label"],
)
def test_what_it_refuses_it_names(
    tmp_path: Path, args: list[str], user: dict[str, Any], said: str
) -> None:
    code, out, err = _run("--kubeconfig", str(_kubeconfig(tmp_path, user)), "--name", "m", *args)
    assert code == 1 and out == ""
    assert said in err and "pw" not in err


def test_a_secret_without_its_token_yet_is_refused(tmp_path: Path) -> None:
    empty = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {}}
    code, _, err = _run(
        *("--server", "https://m.example", "--secret", "-", "--name", "m"),
        stdin=yaml.safe_dump(empty),
    )
    assert code == 1 and "has no token yet" in err


def test_its_help_has_examples() -> None:
    result = CliRunner().invoke(app, ["cluster", "from-kubeconfig", "--help"], terminal_width=120)
    assert result.exit_code == 0
    assert "Examples" in result.output and "qmctl cluster from-kubeconfig" in result.output
