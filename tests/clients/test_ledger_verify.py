"""``qmctl ledger verify`` against exports of a live service that signs
checkpoints: a verify given the key checks the signed checkpoint the export
carries, and says "verified" only when the signature and the root hold."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from quartermaster_client import Client
from quartermaster_client.ledger import canonical_json

from service.ledger.checkpoint import DEFAULT_ORIGIN, NoteSigner
from tests.api.conftest import ADMIN_TOKEN, serve
from tests.clients.test_qmctl import QMCTL
from tests.harness import reset_database

Done = subprocess.CompletedProcess[str]
SIGNED = f"checkpoint: {DEFAULT_ORIGIN} size 2 (from the export): root"


@dataclass
class Exported:
    """Exports of a live ledger of three entries: ``unsigned`` taken before
    any checkpoint, ``export`` after one of the first two entries; the live
    verifies (with the key and with a stranger's) run while it served."""

    key: str
    stranger: str
    unsigned: Path
    export: Path
    live: Done
    forged_live: Done
    run: Callable[..., Done]

    @property
    def lines(self) -> list[str]:
        return self.export.read_text().splitlines()

    def verify(self, lines: list[str] | Path, *args: str) -> Done:
        path = lines if isinstance(lines, Path) else self.export.with_name("altered.ndjson")
        if not isinstance(lines, Path):
            path.write_text("\n".join(lines) + "\n")
        return self.run("ledger", "verify", "--file", str(path), *args)


def _runner(url: str) -> Callable[..., Done]:
    env = {"PATH": "/usr/bin:/bin", "QMCTL_SERVER": url, "QMCTL_TOKEN": ADMIN_TOKEN}

    def run(*args: str) -> Done:
        return subprocess.run(
            [*QMCTL, *args], check=False, capture_output=True, text=True, env=env, timeout=60
        )

    return run


@pytest.fixture(scope="module")
def exported(
    database_url: str, _session_engine: sa.Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Exported]:
    reset_database(_session_engine)
    where = tmp_path_factory.mktemp("ledger")
    signer, seed = NoteSigner.generate(DEFAULT_ORIGIN)
    stranger, _ = NoteSigner.generate(DEFAULT_ORIGIN)
    unsigned, export = where / "unsigned.ndjson", where / "ledger.ndjson"
    with serve(database_url, ledger_signing_key=seed) as (url, _), Client(url, ADMIN_TOKEN) as qm:
        run = _runner(url)
        qm.resourceflavors.create({"metadata": {"name": "h100"}, "spec": {}})
        assert run("ledger", "export", "--file", str(unsigned)).returncode == 0
        qm.cohorts.create({"metadata": {"name": "research"}, "spec": {}})
        assert run("ledger", "checkpoint", "--publish").returncode == 0
        qm.topologies.create(
            {"metadata": {"name": "fabric"}, "spec": {"levels": [{"nodeLabel": "rack"}]}}
        )
        assert run("ledger", "export", "--file", str(export)).returncode == 0
        live = run("ledger", "verify", "--key", signer.verifier_key)
        forged = run("ledger", "verify", "--key", stranger.verifier_key)
    yield Exported(signer.verifier_key, stranger.verifier_key, unsigned, export, live, forged, run)


def _printed(done: Done) -> list[str]:
    return done.stdout.splitlines()


def _resealed(lines: list[str]) -> list[str]:
    """The entries of an export with the first one's body rewritten and every
    hash and link recomputed: what someone who can rewrite the database makes."""
    out, previous = [], "0" * 64
    for line in lines:
        entry = json.loads(line)["entry"]
        if entry["seq"] == 1:
            entry["body"]["name"] = "a100"
        entry["prev_hash"] = previous
        previous = hashlib.sha256(canonical_json(entry)).hexdigest()
        out.append(json.dumps({"entry": entry, "entry_hash": previous}))
    return out


def test_with_the_key_the_exports_checkpoint_is_checked(exported: Exported) -> None:
    """The tour's offline verify (and the live one): the export opens with the
    latest checkpoint, whose signature and root are checked, and the entries
    after it are named as unsigned."""
    opening = json.loads(exported.lines[0])
    assert opening["checkpoint"].startswith(f"{DEFAULT_ORIGIN}\n2\n")
    for good in (exported.verify(exported.export, "--key", exported.key), exported.live):
        assert good.returncode == 0, good.stdout + good.stderr
        assert _printed(good)[0].startswith("3 entries; head ")
        assert _printed(good)[1:] == [
            "chain: every hash and link checked: intact",
            f"{SIGNED} matches",
            "signature: valid",
            "unsigned: 1 entry after the checkpoint "
            "(hashes and links checked, no signature covers them yet)",
            "verified",
        ]


def test_a_key_that_did_not_sign_the_checkpoint_fails(exported: Exported) -> None:
    for forged in (
        exported.verify(exported.export, "--key", exported.stranger),
        exported.forged_live,
    ):
        assert forged.returncode == 8, forged.stdout
        assert "signature: INVALID for the key given" in _printed(forged)
        assert "verified" not in _printed(forged)


def test_a_tampered_entry_fails_even_with_its_chain_recomputed(exported: Exported) -> None:
    checkpoint, *entries = exported.lines
    tampered = json.loads(entries[0])
    tampered["entry"]["body"]["name"] = "a100"
    broken = exported.verify(
        [checkpoint, json.dumps(tampered), *entries[1:]], "--key", exported.key
    )
    assert broken.returncode == 8
    assert "seq 1: the entry's hash does not match its content" in broken.stderr
    assert "chain: every hash and link checked: BROKEN (1 problem)" in _printed(broken)
    assert f"{SIGNED} DOES NOT MATCH" in _printed(broken)
    resealed = exported.verify([checkpoint, *_resealed(entries)], "--key", exported.key)
    assert resealed.returncode == 8 and "  seq " not in resealed.stderr
    assert "chain: every hash and link checked: intact" in _printed(resealed)
    assert f"{SIGNED} DOES NOT MATCH" in _printed(resealed)
    assert "verified" not in _printed(resealed)
    gap = exported.verify([checkpoint, entries[0], entries[2]], "--key", exported.key)
    assert gap.returncode == 8 and "seq 3: expected seq 2: missing or reordered" in gap.stderr
    assert "seq 3: prev_hash does not match the entry before" in gap.stderr


def test_with_the_key_and_no_checkpoint_nothing_is_verified(exported: Exported) -> None:
    """An export taken before any checkpoint, and one whose checkpoint line
    was cut off: the key has nothing to check, and verify says so."""
    cut = exported.lines[1:]
    for unsigned in (
        exported.verify(exported.unsigned, "--key", exported.key),
        exported.verify(cut, "--key", exported.key),
    ):
        assert unsigned.returncode == 8, unsigned.stdout
        assert _printed(unsigned)[1] == "chain: every hash and link checked: intact"
        assert _printed(unsigned)[2].startswith("checkpoint: none (the export carries none")
        assert "signature: not checked (no checkpoint)" in _printed(unsigned)
        assert "NOT verified: no signed checkpoint to check the key against" in unsigned.stderr
        assert "verified" not in _printed(unsigned)


def test_without_a_key_no_signature_is_claimed(exported: Exported) -> None:
    keyless = exported.verify(exported.export)
    assert keyless.returncode == 0
    assert _printed(keyless)[1:] == [
        "chain: every hash and link checked: intact",
        f"{SIGNED} matches",
        "signature: not checked (give --key)",
        "unsigned: 1 entry after the checkpoint "
        "(hashes and links checked, no signature covers them yet)",
        "not verified: hashes and links intact, no signature checked (give --key)",
    ]


def test_a_checkpoint_given_as_a_file_is_the_one_checked(exported: Exported) -> None:
    checkpoint, *entries = exported.lines
    given = exported.export.with_name("checkpoint.txt")
    given.write_text(json.loads(checkpoint)["checkpoint"])
    from_file = exported.verify(entries, "--checkpoint", str(given), "--key", exported.key)
    assert from_file.returncode == 0 and _printed(from_file)[-1] == "verified"
    assert f"checkpoint: {DEFAULT_ORIGIN} size 2 (from --checkpoint): root matches" in (
        _printed(from_file)
    )
