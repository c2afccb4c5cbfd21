"""The Ledger page in a real browser, after gangs ran and a checkpoint was
signed: entries browsed and filtered, an entry's inclusion proof checked by
the browser (WebCrypto: SHA-256 up the Merkle path, Ed25519 on the
checkpoint) and failing when one byte served is altered — in the response,
or in the database by a superuser who reseals the entry — the checkpoints'
signatures, the export that ``qmctl ledger verify`` accepts, and the newest
entries following the fleet live."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from service.ledger.canonical import canonical_json
from service.ledger.checkpoint import DEFAULT_ORIGIN, NoteSigner, open_checkpoint
from service.ledger.merkle import leaf_hash, verify_inclusion
from tests.console.conftest import sign_in
from tests.console.gangs import Fleet, fleet_that_ran
from tests.console.test_live import _not_reloaded, _still_same
from tests.ledger.tampering import tamper
from tests.workers.members import gang

QMCTL = [sys.executable, "-m", "quartermaster_client.cli"]


@pytest.fixture(scope="module")
def fleet(
    _session_engine: sa.Engine,
    database_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    where = tmp_path_factory.mktemp("ledger-fleet")
    with fleet_that_ran(_session_engine, database_url, redis_url, where) as ran:
        yield ran


@pytest.fixture(scope="module")
def auditor_token(fleet: Fleet) -> str:
    issued = fleet.admin.post("/v1/tokens", json={"name": "audit", "role": "auditor"})
    assert issued.status_code == 201, issued.text
    token: str = issued.json()["token"]
    return token


@pytest.fixture
def auditor(fleet: Fleet, auditor_token: str, browse: Callable[[], Any]) -> Any:
    """A browser page signed in as an auditor (not an admin)."""
    page = browse()
    sign_in(page, fleet.base_url, auditor_token, start="/ui/ledger")
    return page


def verdict(page: Any) -> tuple[str, str]:
    """The browser's result, once it has one: (``verified`` | ``failed``, its words)."""
    shown = page.locator('#verdict:not([data-result="pending"])')
    shown.wait_for()
    return str(shown.get_attribute("data-result")), shown.inner_text()


def served(page: Any) -> tuple[dict[str, Any], list[bytes], str]:
    """What the entry page gave the browser to check: the export line, the
    path and the checkpoint note."""
    line = json.loads(page.locator("#entry-line").inner_text())
    path = [base64.b64decode(c) for c in page.locator("#proof-path code").all_inner_texts()]
    note = page.locator("#checkpoint-note").text_content()
    return line, path, note


def python_says(line: dict[str, Any], path: list[bytes], note: str, signer: NoteSigner) -> bool:
    """The service's own verifier on the same material."""
    checkpoint = open_checkpoint(note, signer.verifier())
    data = canonical_json(line["entry"])
    return hashlib.sha256(data).hexdigest() == line["entry_hash"] and verify_inclusion(
        leaf_hash(data), line["entry"]["seq"] - 1, checkpoint.size, path, checkpoint.root_hash
    )


def test_entries_are_listed_newest_first_filtered_and_paged(fleet: Fleet, auditor: Any) -> None:
    page = auditor
    assert page.title() == "Ledger · Quartermaster"
    seqs = [
        int(s)
        for s in page.locator("tbody tr[data-seq]").evaluate_all(
            "rows => rows.map(r => r.dataset.seq)"
        )
    ]
    assert seqs == sorted(seqs, reverse=True) and len(seqs) >= 12
    page.get_by_label("Kind").select_option("workload.admitted")
    page.get_by_label("Namespace").fill("team-a")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r".*kind=workload.admitted.*namespace=team-a.*"))
    rows = page.locator("tbody tr[data-seq]")
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.kind)") == ["workload.admitted"] * 2
    admitted = {
        e["body"]["workload"]
        for e in fleet.entries("workload.admitted")
        if e["body"]["namespace"] == "team-a"
    }
    assert set(page.locator("tbody tr td:nth-child(5)").all_inner_texts()) == admitted
    # Keyset pages of 5: every entry once, newest first, however it grew.
    page.goto(f"{fleet.base_url}/ui/ledger?limit=5")
    paged: list[int] = []
    while True:
        paged += [
            int(s)
            for s in page.locator("tbody tr[data-seq]").evaluate_all(
                "rows => rows.map(r => r.dataset.seq)"
            )
        ]
        older = page.get_by_role("link", name="Older entries")
        if older.count() == 0:
            break
        older.click()
        page.wait_for_load_state()
    assert paged == list(range(max(seqs), 0, -1))
    # A time range before anything was recorded holds nothing.
    page.goto(f"{fleet.base_url}/ui/ledger?until=2000-01-01T00:00")
    assert page.locator("tbody td.empty").inner_text() == "No entries match."


@pytest.mark.parametrize("which", ["first", "middle", "last"])
def test_the_browser_verifies_an_entry_against_the_latest_signed_checkpoint(
    fleet: Fleet, auditor: Any, which: str
) -> None:
    seq = {"first": 1, "middle": fleet.size // 2 + 1, "last": fleet.size}[which]
    page = auditor
    page.goto(f"{fleet.base_url}/ui/ledger/entries/{seq}")
    assert page.title() == f"Ledger entry {seq} · Quartermaster"
    result, words = verdict(page)
    assert result == "verified", words
    assert words == (
        f"Verified: entry {seq} is in the checkpoint of {fleet.size} entries of "
        f"{DEFAULT_ORIGIN}, signed by the key above."
    )
    marks = page.locator("#checks li").evaluate_all("items => items.map(i => i.dataset.result)")
    assert marks == ["ok", "ok", "ok", "ok"]
    line, path, note = served(page)
    assert note == fleet.note and python_says(line, path, note, fleet.signer)
    assert page.get_by_label("Verifier key").input_value() == fleet.signer.verifier_key


def test_a_workloads_ledger_entries_lead_to_their_verified_pages(
    fleet: Fleet, auditor: Any
) -> None:
    admitted = next(e for e in fleet.entries("workload.admitted") if e["seq"] <= fleet.size)
    body = admitted["body"]
    page = auditor
    page.goto(f"{fleet.base_url}/ui/workloads/{body['namespace']}/{body['workload']}")
    page.get_by_role("link", name=f"Ledger entry {admitted['seq']}").click()
    page.wait_for_url(re.compile(rf".*/ui/ledger/entries/{admitted['seq']}$"))
    assert verdict(page)[0] == "verified"


def _alter_entry(html: str) -> str:
    """One hex digit of the entry id, inside the export line only."""
    start = html.index('<pre id="entry-line"')
    at = html.index("entry_id&#34;:&#34;", start) + len("entry_id&#34;:&#34;")
    return html[:at] + ("1" if html[at] != "1" else "2") + html[at + 1 :]


def _alter_path(html: str) -> str:
    """One base64 character of the deepest sibling's hash."""
    at = html.index('<ol id="proof-path"')
    at = html.index("<code>", at) + len("<code>")
    return html[:at] + ("B" if html[at] != "B" else "C") + html[at + 1 :]


def _alter_root(html: str) -> str:
    """The checkpoint's root hash, one character (its signature no longer fits either)."""
    start = html.index('<pre id="checkpoint-note"')
    lines = html[start:].split("\n", 3)
    at = start + len(lines[0]) + len(lines[1]) + 2
    return html[:at] + ("A" if html[at] != "A" else "B") + html[at + 1 :]


def _alter_signature(html: str) -> str:
    """A character of the signature itself, past its key id."""
    at = html.index("\u2014 " + DEFAULT_ORIGIN + " ", html.index('<pre id="checkpoint-note"'))
    at += len("\u2014 " + DEFAULT_ORIGIN + " ") + 20
    return html[:at] + ("A" if html[at] != "A" else "B") + html[at + 1 :]


ALTERATIONS = {
    "entry": (_alter_entry, "hash", "the entry's hash does not match its content"),
    "path": (_alter_path, "root", "the path leads to a root that is not the checkpoint's"),
    "root": (_alter_root, "root", "the path leads to a root that is not the checkpoint's"),
    "signature": (
        _alter_signature,
        "signature",
        f"no valid signature by {DEFAULT_ORIGIN} (key id {{key_id}})",
    ),
}


@pytest.mark.parametrize("what", sorted(ALTERATIONS))
def test_one_byte_altered_in_the_served_page_fails_the_check(
    fleet: Fleet, auditor: Any, what: str
) -> None:
    alter, failed_check, reason = ALTERATIONS[what]
    seq = fleet.entries("workload.admitted")[0]["seq"]
    url = f"{fleet.base_url}/ui/ledger/entries/{seq}"
    originals: list[str] = []

    def altered(route: Any) -> None:
        response = route.fetch()
        originals.append(response.text())
        route.fulfill(response=response, body=alter(originals[-1]))

    page = auditor
    page.route(url, altered)
    page.goto(url)
    result, words = verdict(page)
    reason = reason.format(key_id=fleet.signer.key_id.hex())
    assert (result, words) == ("failed", f"NOT verified: {reason}.")
    marks = dict(
        page.locator("#checks li").evaluate_all(
            "items => items.map(i => [i.dataset.check, i.dataset.result])"
        )
    )
    assert marks[failed_check] == "failed", marks
    changed = alter(originals[0])
    assert sum(a != b for a, b in zip(changed, originals[0], strict=True)) == 1
    # The same page unaltered verifies: the alteration is what failed it.
    page.unroute(url)
    page.goto(url)
    assert verdict(page)[0] == "verified"


def test_another_entry_served_for_the_one_asked_fails(fleet: Fleet, auditor: Any) -> None:
    """A whole, valid page of entry 2 served for entry 1: everything in it
    verifies, but it is not the entry the address asks for."""
    page = auditor
    other = page.request.get(f"{fleet.base_url}/ui/ledger/entries/2")
    assert other.status == 200
    url = f"{fleet.base_url}/ui/ledger/entries/1"
    page.route(url, lambda route: route.fulfill(response=other))
    page.goto(url)
    assert verdict(page) == ("failed", "NOT verified: the entry served is entry 2, not 1.")


def test_a_key_other_than_the_signers_is_refused(fleet: Fleet, auditor: Any) -> None:
    other, _ = NoteSigner.generate(DEFAULT_ORIGIN)
    page = auditor
    page.goto(f"{fleet.base_url}/ui/ledger/entries/1")
    assert verdict(page)[0] == "verified"
    page.get_by_label("Verifier key").fill(other.verifier_key)
    page.get_by_role("button", name="Verify again").click()
    page.locator('#checks li[data-check="signature"][data-result="failed"]').wait_for()
    result, words = verdict(page)
    assert result == "failed"
    assert (
        words
        == f"NOT verified: no valid signature by {DEFAULT_ORIGIN} (key id {other.key_id.hex()})."
    )


def test_the_checkpoints_are_listed_with_their_signatures_checked(
    fleet: Fleet, auditor: Any
) -> None:
    page = auditor
    page.get_by_role("link", name="Checkpoints").first.click()
    page.wait_for_url(re.compile(r".*/ui/ledger/checkpoints$"))
    assert page.title() == "Checkpoints · Quartermaster"
    row = page.locator(f'tr.checkpoint-row[data-size="{fleet.size}"]')
    row.locator('td.signature[data-result="verified"]').wait_for()
    assert row.locator("td.signature").inner_text() == "\u2713 signed by the key"
    other, _ = NoteSigner.generate(DEFAULT_ORIGIN)
    page.get_by_label("Verifier key").fill(other.verifier_key)
    page.get_by_role("button", name="Check signatures").click()
    row.locator('td.signature[data-result="failed"]').wait_for()


def test_the_export_link_gives_what_qmctl_ledger_verify_accepts(
    fleet: Fleet, auditor: Any, tmp_path: Path
) -> None:
    page = auditor
    link = page.get_by_role("link", name=re.compile(r"^Export the whole ledger"))
    exported = page.request.get(fleet.base_url + link.get_attribute("href"))
    assert exported.status == 200
    assert exported.headers["content-disposition"] == 'attachment; filename="ledger.ndjson"'
    path = tmp_path / "ledger.ndjson"
    path.write_bytes(exported.body())
    assert json.loads(path.read_text().splitlines()[0]) == {"checkpoint": fleet.note}
    env = {"QMCTL_CONFIG": str(tmp_path / "qmctl"), "PATH": "/usr/bin:/bin"}
    command = [*QMCTL, "ledger", "verify", "-f", str(path), "--key", fleet.signer.verifier_key]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    # One byte changed, and qmctl refuses it as the browser does.
    data = bytearray(path.read_bytes())
    data[data.index(b'"kind":"workload.admitted"') + 9] ^= 0x01
    path.write_bytes(bytes(data))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode != 0 and "does NOT verify" in done.stderr


def _reseal(engine: sa.Engine, document: dict[str, Any]) -> None:
    """Store ``document`` as its entry, bytes and hash, as only a superuser can."""
    data = canonical_json(document)
    body = json.dumps(document["body"]).replace("'", "''")
    tamper(
        engine,
        f"UPDATE ledger_entries SET body = '{body}'::jsonb, "
        f"entry_bytes = '\\x{data.hex()}'::bytea, "
        f"entry_hash = '\\x{hashlib.sha256(data).hexdigest()}'::bytea "
        f"WHERE seq = {int(document['seq'])}",
    )


def test_an_entry_resealed_in_the_database_fails_the_check(fleet: Fleet, auditor: Any) -> None:
    """A superuser rewrites one stored entry and reseals it (its bytes and
    hash recomputed, the constraint tying them kept): the entry now matches
    its own hash, but not the signed tree."""
    entry = next(e for e in fleet.entries("workload.admitted") if e["body"]["cluster"] == "c1")
    url = f"{fleet.base_url}/ui/ledger/entries/{entry['seq']}"
    page = auditor
    page.goto(url)
    assert verdict(page)[0] == "verified"
    original = json.loads(page.locator("#entry-line").inner_text())["entry"]
    _reseal(fleet.services.engine, {**original, "body": {**original["body"], "cluster": "c2"}})
    try:
        page.goto(url)
        line = json.loads(page.locator("#entry-line").inner_text())
        assert line["entry"]["body"]["cluster"] == "c2"
        assert line["entry_hash"] != entry["hash"]
        result, words = verdict(page)
        assert (result, words) == (
            "failed",
            "NOT verified: the path leads to a root that is not the checkpoint's.",
        )
        marks = page.locator("#checks li").evaluate_all("its => its.map(i => i.dataset.result)")
        assert marks == ["ok", "ok", "failed", "skipped"]
    finally:
        _reseal(fleet.services.engine, original)
    page.goto(url)
    assert verdict(page)[0] == "verified"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("/ui/ledger?since=yesterday", "since"),
        ("/ui/ledger?since=2026-12-02T10:00&until=2026-12-01T10:00", "until"),
        ("/ui/ledger?kind=workload.teleported", "kind"),
        ("/ui/ledger?namespace=Team_A", "namespace"),
        ("/ui/ledger?before=0", "before"),
        ("/ui/ledger/entries/0", "seq"),
        ("/ui/ledger/export?format=xml", "format"),
        ("/ui/ledger/rows?since=yesterday", "since"),
        ("/ui/ledger/rows?kind=workload.teleported", "kind"),
        ("/ui/ledger/rows?before=0", "before"),
    ],
)
def test_bad_input_is_an_error_page_naming_the_field(
    fleet: Fleet, auditor: Any, query: str, field: str
) -> None:
    answer = auditor.request.get(fleet.base_url + query)
    assert answer.status == 422, answer.text()
    assert f"<code>{field}</code>" in answer.text()


def _seqs(page: Any) -> list[int]:
    found = page.locator("tbody tr[data-seq]").evaluate_all("rs => rs.map(r => r.dataset.seq)")
    return [int(s) for s in found]


def test_the_newest_page_shows_a_new_entry_without_a_reload_and_an_older_one_stays(
    fleet: Fleet, auditor: Any, browse: Callable[..., Any]
) -> None:
    """Last in this module: the gang it submits adds entries to the ledger."""
    newest = auditor
    older = browse(beside=newest)
    older.goto(f"{fleet.base_url}/ui/ledger?before={max(_seqs(newest)) + 1}")
    kept = _seqs(older)
    assert kept == _seqs(newest)
    assert older.locator("[sse-connect]").count() == 0  # an older page does not follow
    newest.locator("#live.on").wait_for()
    _not_reloaded(newest, older)

    created = fleet.admin.post("/v1/namespaces/team-b/workloads", json=gang("watched"))
    assert created.status_code == 201, created.text
    row = newest.locator('tbody tr[data-kind="workload.admitted"]', has_text="watched")
    row.wait_for()
    assert int(str(row.get_attribute("data-seq"))) > max(kept)
    assert _seqs(newest) == sorted(_seqs(newest), reverse=True)
    assert _seqs(older) == kept
    _still_same(newest, older)


def test_the_fragment_is_refused_to_whom_the_page_is(
    fleet: Fleet, browse: Callable[[], Any]
) -> None:
    body = {"name": "ledger-submitter", "role": "submitter", "namespaces": ["team-a"]}
    issued = fleet.admin.post("/v1/tokens", json=body)
    assert issued.status_code == 201, issued.text
    page = browse()
    sign_in(page, fleet.base_url, issued.json()["token"], start="/ui/workloads")
    for path in ("/ui/ledger", "/ui/ledger/rows", "/ui/ledger/rows?namespace=team-a"):
        answer = page.request.get(fleet.base_url + path)
        assert answer.status == 403, (path, answer.text())
        assert "team-b" not in answer.text()
