"""``qmctl apply`` warns of a ClusterQueue whose quota names a flavor that no
node of the fleet carries (issue 17, finding 2): the API answers the write
with a ``Warning: 299`` header, as Kubernetes does, and qmctl prints it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from quartermaster_client import Client

from service.app.bootstrap import Services
from tests.api.conftest import ADMIN_TOKEN
from tests.workers.conftest import set_cluster_status

FLEET = """\
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: h100}
spec: {nodeLabels: {sku: h100}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: exclusive}
spec: {nodeLabels: {sku: h100, pool: train-exclusive}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: cq}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: h100
      resources: [{name: nvidia.com/gpu, nominalQuota: 8}]
    - name: exclusive
      resources: [{name: nvidia.com/gpu, nominalQuota: 8}]
"""


def _member(qm: Client, services: Services) -> None:
    """Cluster c1 with one node labelled ``sku: h100``, as sync writes it."""
    qm.create(
        {
            "apiVersion": "quartermaster.dev/v1",
            "kind": "Cluster",
            "metadata": {"name": "c1"},
            "spec": {"server": "https://c1.example:6443", "credentials": {"token": "t"}},
        }
    )
    node = {
        "name": "n1",
        "flavor": "h100",
        "island": "c1-h100",
        "labels": {"sku": "h100"},
        "allocatable": {"cpu": "96", "nvidia.com/gpu": 8},
    }
    set_cluster_status(services, "c1", {"state": "Ready", "inventory": {"nodes": [node]}})


def test_apply_warns_of_quota_for_a_flavor_no_node_carries(
    qm: Client, served: tuple[str, Services], tmp_path: Path
) -> None:
    url, services = served
    _member(qm, services)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    env = {"QMCTL_CONFIG": str(tmp_path / "config"), "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "quartermaster_client.cli", "--server", url]
    done = subprocess.run(
        [*command, "--token", ADMIN_TOKEN, "apply", "-f", str(fleet)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "clusterqueue/cq created" in done.stdout
    assert (
        "warning: ClusterQueue cq: no node of the fleet carries flavor exclusive's labels "
        "(pool=train-exclusive, sku=h100): its quota cannot be used"
    ) in done.stderr
    assert "flavor h100's" not in done.stderr

    # The header itself, on a replace, in RFC 7234's form.
    current = qm.get("ClusterQueue", "cq").to_dict()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        replaced = http.put("/v1/clusterqueues/cq", json=current)
    assert replaced.status_code == 200, replaced.text
    (warning,) = replaced.headers.get_list("warning")
    assert warning.startswith(
        '299 - "ClusterQueue cq: no node of the fleet carries flavor exclusive'
    )
    assert warning.endswith('its quota cannot be used"')
