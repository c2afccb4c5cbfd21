"""The auditors' API: every decision the API makes is in the ledger, in the
same transaction; entries filter and page; checkpoints are signed; proofs
check against them; exports verify offline with `quartermaster ledger verify`."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from service.ledger.checkpoint import DEFAULT_ORIGIN, NoteSigner, NoteVerifier, open_checkpoint
from service.ledger.merkle import verify_consistency, verify_inclusion
from service.ledger.postgres import PostgresLedgerReader
from service.ledger.proofs import leaf_of
from tests.api.conftest import ADMIN_TOKEN, Api, serve, setup_quota, workload
from tests.api.test_resources import _problem

CLI = str(Path(sys.executable).with_name("quartermaster"))


def _decisions(api: Api) -> None:
    setup_quota(api.admin)
    for name in ("a", "b", "c"):
        assert (
            api.admin.post("/v1/namespaces/team-a/workloads", json=workload(name)).status_code
            == 201
        )
    bad = workload("bad")
    bad["spec"]["podSets"][0]["template"]["spec"]["hostNetwork"] = True
    assert api.admin.post("/v1/namespaces/team-a/workloads", json=bad).status_code == 422
    assert (
        api.admin.patch("/v1/clusterqueues/cq-a", json={"spec": {"stopPolicy": "Hold"}}).status_code
        == 200
    )


def test_every_decision_is_in_the_ledger_and_filters_page(api: Api) -> None:
    _decisions(api)
    auditor = api.as_role("auditor")
    entries = auditor.get("/v1/ledger/entries", params={"limit": 1000}).json()["items"]
    kinds = [e["kind"] for e in entries]
    assert kinds.count("workload.submitted") == 3
    assert kinds.count("policy.refused") == 1
    assert kinds.count("quota.changed") == 2  # created, then stopped
    assert kinds.count("config.changed") == 2  # the flavor and the LocalQueue
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    refused = next(e for e in entries if e["kind"] == "policy.refused")
    assert refused["body"]["rules"][0]["rule"] == "spec.podSets[0].template.spec.hostNetwork"
    change = [e for e in entries if e["kind"] == "quota.changed"][-1]
    assert change["body"]["before"]["stopPolicy"] == "None"
    assert change["body"]["after"]["stopPolicy"] == "Hold"
    assert change["body"]["actor"] == "bootstrap"
    mine = auditor.get(
        "/v1/ledger/entries", params={"kind": "workload.submitted", "clusterQueue": "cq-a"}
    ).json()["items"]
    assert [e["body"]["workload"] for e in mine] == ["a", "b", "c"]
    first = auditor.get("/v1/ledger/entries", params={"limit": 2}).json()
    rest = auditor.get("/v1/ledger/entries", params={"after": first["next"], "limit": 1000}).json()
    assert [e["seq"] for e in first["items"] + rest["items"]] == [e["seq"] for e in entries]
    _problem(auditor.get("/v1/ledger/entries", params={"limit": 0}), 422, "invalid-request")


def test_only_auditors_and_admins_read_the_ledger(api: Api) -> None:
    _decisions(api)
    for role in ("queue-admin", "cluster-admin"):
        _problem(api.as_role(role).get("/v1/ledger/entries"), 403, "forbidden")
    _problem(api.as_role("submitter", ["team-a"]).get("/v1/usage"), 403, "forbidden")
    auditor = api.as_role("auditor")
    _problem(auditor.post("/v1/ledger/checkpoints"), 403, "forbidden")
    assert auditor.get("/v1/usage", params={"by": ["namespace", "flavor"]}).status_code == 200
    _problem(auditor.get("/v1/usage", params={"by": "colour"}), 422, "invalid")
    # Without a signing key nothing can be signed, and it says so.
    _problem(api.admin.post("/v1/ledger/checkpoints"), 503, "not-configured")
    _problem(auditor.get("/v1/ledger/checkpoints/latest"), 404, "not-found")


def test_checkpoints_proofs_and_an_export_that_verifies_offline(
    database_url: str, api: Api, engine: sa.Engine, tmp_path: Path
) -> None:
    signer, seed = NoteSigner.generate(DEFAULT_ORIGIN)
    _decisions(api)
    with serve(database_url, ledger_signing_key=seed) as (base_url, _):
        import httpx

        admin = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        first = admin.post("/v1/ledger/checkpoints")
        assert first.status_code == 201, first.text
        verifier = NoteVerifier.from_key(signer.verifier_key)
        older = open_checkpoint(first.text, verifier)
        admin.post("/v1/namespaces/team-a/workloads", json=workload("d"))
        note = admin.post("/v1/ledger/checkpoints").text
        assert admin.get("/v1/ledger/checkpoints/latest").text == note
        newer = open_checkpoint(note, verifier)
        assert newer.size == older.size + 1

        entry = next(e for e in PostgresLedgerReader(engine).entries() if e.seq == 2)
        proof = admin.get(
            "/v1/ledger/proofs/inclusion", params={"seq": 2, "size": newer.size}
        ).json()
        hashes = [base64.b64decode(h) for h in proof["hashes"]]
        assert base64.b64decode(proof["rootHash"]) == newer.root_hash
        assert verify_inclusion(leaf_of(entry), 1, newer.size, hashes, newer.root_hash)
        assert not verify_inclusion(leaf_of(entry), 2, newer.size, hashes, newer.root_hash)
        consistency = admin.get(
            "/v1/ledger/proofs/consistency", params={"from": older.size, "to": newer.size}
        ).json()
        path = [base64.b64decode(h) for h in consistency["hashes"]]
        assert verify_consistency(older.size, newer.size, older.root_hash, newer.root_hash, path)

        export = tmp_path / "ledger.ndjson"
        with admin.stream("GET", "/v1/ledger/export") as response:
            assert response.headers["content-type"].startswith("application/x-ndjson")
            export.write_bytes(b"".join(response.iter_bytes()))
        csv = admin.get("/v1/ledger/export", params={"format": "csv"}).text
        assert len(csv.strip().splitlines()) == newer.size + 1  # a header and every entry
        admin.close()
    (tmp_path / "checkpoint").write_text(note)
    (tmp_path / "older").write_text(first.text)
    (tmp_path / "key").write_text(signer.verifier_key + "\n")
    command = [
        CLI,
        "ledger",
        "verify",
        "--export",
        str(export),
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--older",
        str(tmp_path / "older"),
        "--public-key",
        str(tmp_path / "key"),
    ]
    ok = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = export.read_bytes().splitlines()
    target = next(i for i, line in enumerate(lines) if b'"team-a"' in line)
    lines[target] = lines[target].replace(b'"team-a"', b'"team-b"', 1)
    export.write_bytes(b"\n".join(lines) + b"\n")
    tampered = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    assert tampered.returncode == 1, tampered.stdout


def test_proofs_follow_a_ledger_that_was_emptied_and_leave_no_cursor_open(
    api: Api, engine: sa.Engine
) -> None:
    from tests.harness import reset_database

    _decisions(api)
    auditor = api.as_role("auditor")
    assert auditor.get("/v1/ledger/proofs/inclusion", params={"seq": 3}).status_code == 200
    reset_database(engine)  # the server's tree now describes a ledger that is gone
    auditor = api.as_role("auditor")
    setup_quota(api.admin, namespace="team-z", cq="cq-z")
    proof = auditor.get("/v1/ledger/proofs/inclusion", params={"seq": 1})
    assert proof.status_code == 200, proof.text
    with engine.connect() as conn:
        stuck = conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND state = 'idle in transaction'"
        ).scalar_one()
    assert stuck == 0
