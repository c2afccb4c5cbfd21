"""The README's curl walkthrough ("The API with curl") runs as written, in
bash, against a live API: every request must succeed (curl fails the script
on an HTTP error), and what it claims must hold afterwards."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.api.conftest import ADMIN_TOKEN, Api

README = Path(__file__).resolve().parents[2] / "README.md"


def _walkthrough() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## The API with curl")
    end = text.index("\n## ", start + 1)
    (block,) = re.findall(r"```sh\n(.*?)```", text[start:end], flags=re.S)
    return block


@pytest.mark.skipif(shutil.which("curl") is None, reason="the walkthrough is written for curl")
def test_the_readme_curl_walkthrough(api: Api, tmp_path: Path) -> None:
    script = _walkthrough()
    assert script.startswith("export QM=http://127.0.0.1:8080 ")
    # The server's address is the test's; a failed request fails the script
    # (--fail-with-body), and each answer goes to stdout on a line of its own.
    script = script.replace("QM=http://127.0.0.1:8080", f"QM={api.base_url}", 1)
    prelude = 'set -euo pipefail\ncurl() { command curl --fail-with-body "$@"; echo; }\n'
    ran = subprocess.run(
        ["bash", "-c", prelude + script],
        env={"PATH": os.environ["PATH"], "QM_BOOTSTRAP_TOKEN": ADMIN_TOKEN, "HOME": str(tmp_path)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    answers = [json.loads(line) for line in ran.stdout.splitlines() if line.strip()]
    flavor, cq, lq, token, job, explained = answers
    assert flavor["kind"] == "ResourceFlavor" and flavor["metadata"]["name"] == "h100"
    assert cq["spec"]["resourceGroups"][0]["flavors"][0]["name"] == "h100"
    assert lq["spec"]["clusterQueue"] == "team-a"
    assert token["role"] == "submitter" and token["token"]
    assert job["metadata"]["name"] == "my-job" and job["spec"]["podSets"][0]["count"] == 2
    assert explained["state"] == "Pending" and explained["clusterQueue"] == "team-a"
    # The scoped token works for its namespace and nowhere else.
    team = api.client(token["token"])
    assert team.get("/v1/namespaces/team-a/workloads").status_code == 200
    assert team.get("/v1/namespaces/team-b/workloads").status_code == 403
