"""``quartermaster sim cluster`` as a user runs it: a subprocess, a kubeconfig, a clean stop."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from tests.kubesim.conftest import DEMO

CLI = Path(sys.executable).with_name("quartermaster")


def _free_port_pair() -> int:
    """A port P with P and P + 1 both free (the second cluster takes P + 1)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no two consecutive free ports")


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, list[dict[str, str]]]]:
    port = _free_port_pair()
    kubeconfig = tmp_path / "out" / "kubeconfig"
    process = subprocess.Popen(
        [
            str(CLI),
            "sim",
            "cluster",
            "--fleet",
            str(DEMO),
            "--port",
            str(port),
            "--kubeconfig-out",
            str(kubeconfig),
            "--count",
            "2",
            "--seed-kueue",
            "--time-scale",
            "0.01",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        announced = []
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("{"):
                announced.append(json.loads(line))
            if line.startswith("kubeconfig written"):
                break
        assert kubeconfig.exists(), process.stderr.read() if process.stderr else ""
        yield process, kubeconfig, announced
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def test_cluster_command_serves_the_fleet_and_stops_cleanly(
    served: tuple[subprocess.Popen[str], Path, list[dict[str, str]]],
) -> None:
    process, kubeconfig, announced = served
    assert [entry["cluster"] for entry in announced] == ["east-1", "west-1"]
    assert [entry["backend"] for entry in announced] == ["kueue", "kueue"]  # the fleet's default
    east_port = int(announced[0]["server"].rsplit(":", 1)[1])
    assert int(announced[1]["server"].rsplit(":", 1)[1]) == east_port + 1
    assert kubeconfig.stat().st_mode & 0o077 == 0  # holds tokens: owner-only

    contexts, current = config.list_kube_config_contexts(str(kubeconfig))
    assert [c["name"] for c in contexts] == ["east-1", "west-1"] and current["name"] == "east-1"
    nodes = {}
    for name in ("east-1", "west-1"):
        with config.new_client_from_config(str(kubeconfig), context=name) as api_client:
            listed = client.CoreV1Api(api_client).list_node().items
            nodes[name] = {n.metadata.labels["example.com/gpu"] for n in listed}, len(listed)
            queues = client.CustomObjectsApi(api_client).list_cluster_custom_object(
                "kueue.x-k8s.io", "v1beta2", "clusterqueues"
            )
            assert {q["metadata"]["name"] for q in queues["items"]} == {
                "vision",
                "language",
                "serving",
            }
    assert nodes == {"east-1": ({"h100", "a100"}, 12), "west-1": ({"h100", "a100"}, 14)}

    # A client holding a keep-alive connection must not delay the stop.
    lingering = config.new_client_from_config(str(kubeconfig), context="west-1")
    client.CoreV1Api(lingering).list_namespace()
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    assert time.monotonic() - started < 5
    assert _refused(east_port) and _refused(east_port + 1)
    lingering.close()
    assert process.stderr is not None
    assert "Traceback" not in process.stderr.read()


def test_cluster_command_rejects_more_clusters_than_the_fleet_has(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            str(CLI),
            "sim",
            "cluster",
            "--fleet",
            str(DEMO),
            "--kubeconfig-out",
            str(tmp_path / "kubeconfig"),
            "--count",
            "9",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    clusters = len(yaml.safe_load(DEMO.read_text())["clusters"])
    assert f"the fleet has {clusters} cluster(s), 9 requested" in result.stderr
    assert not (tmp_path / "kubeconfig").exists()


def test_cluster_command_reports_a_taken_port_and_stops_what_it_started(tmp_path: Path) -> None:
    port = _free_port_pair()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port + 1))
        squatter.listen()
        result = subprocess.run(
            [
                str(CLI),
                "sim",
                "cluster",
                "--fleet",
                str(DEMO),
                "--port",
                str(port),
                "--count",
                "2",
                "--kubeconfig-out",
                str(tmp_path / "kubeconfig"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert "cluster west-1: cannot listen on 127.0.0.1" in result.stderr
    assert "Traceback" not in result.stderr
    assert _refused(port)  # east-1 was started, then stopped
    assert not (tmp_path / "kubeconfig").exists()
