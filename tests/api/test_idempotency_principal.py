"""Idempotency-Keys scoped by the authenticated principal (issue 18, finding
9's lesson applied to keys): one token however its Authorization header is
spelt is one caller, whose retry gets the original answer; two callers with
the same key never see each other's answers."""

from __future__ import annotations

import httpx

from tests.api.conftest import ADMIN_TOKEN, Api, setup_quota, workload

PATH = "/v1/namespaces/team-a/workloads"
SPELLINGS = ["Bearer {}", "bearer {}", "Bearer  {}", "BEARER {}"]


def _token(client: httpx.Client) -> str:
    return client.headers["authorization"].split(" ", 1)[1]


def test_one_token_spelt_any_way_gets_its_original_answer(api: Api) -> None:
    setup_quota(api.admin)
    submitter = _token(api.as_role("submitter", ["team-a"]))
    for token, name in ((submitter, "spelt"), (ADMIN_TOKEN, "spelt-by-admin")):
        answers = [
            api.admin.post(
                PATH,
                json=workload(name),
                headers={"Authorization": spelling.format(token), "Idempotency-Key": "k"},
            )
            for spelling in SPELLINGS
        ]
        first, *retries = answers
        assert first.status_code == 201, first.text
        assert "idempotent-replayed" not in first.headers
        for again in retries:
            # Not run again (that would be 409, the name taken): replayed.
            assert (again.status_code, again.content) == (201, first.content), again.text
            assert again.headers["idempotent-replayed"] == "true"
    names = [w["metadata"]["name"] for w in api.admin.get(PATH).json()["items"]]
    assert sorted(names) == ["spelt", "spelt-by-admin"]


def test_two_principals_with_one_key_never_see_each_others_answers(api: Api) -> None:
    setup_quota(api.admin)
    alice = api.as_role("submitter", ["team-a"], name="alice")
    bob = api.as_role("submitter", ["team-a"], name="bob")
    key = {"Idempotency-Key": "same-key"}
    mine = alice.post(PATH, json=workload("shared-name"), headers=key)
    assert mine.status_code == 201, mine.text
    # Bob's request with Alice's key and body runs as his own: the name is
    # taken, and he is told so, not handed Alice's 201.
    theirs = bob.post(PATH, json=workload("shared-name"), headers=key)
    assert theirs.status_code == 409, theirs.text
    assert "idempotent-replayed" not in theirs.headers
    # Nor is his key Alice's: another body under it is his first, not a reuse.
    other = bob.post(PATH, json=workload("bobs"), headers={"Idempotency-Key": "other-key"})
    assert other.status_code == 201, other.text
    reused = alice.post(PATH, json=workload("bobs"), headers={"Idempotency-Key": "other-key"})
    assert reused.status_code == 409 and "idempotent-replayed" not in reused.headers
    # Each one's retry gets its own original answer.
    again = alice.post(PATH, json=workload("shared-name"), headers=key)
    assert (again.status_code, again.content) == (201, mine.content)
    again = bob.post(PATH, json=workload("shared-name"), headers=key)
    assert (again.status_code, again.content) == (409, theirs.content)
    assert again.headers["idempotent-replayed"] == "true"
