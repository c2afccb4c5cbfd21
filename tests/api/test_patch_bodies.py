"""A merge patch must be an object: any other JSON value (a huge float, a
list, a string) is a 4xx naming the body, never a 500."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api


@pytest.mark.parametrize(
    "body", [b"-1.7976931348623157e+308", b"[1, 2]", b'"spec"', b"null", b"1e999"]
)
def test_a_merge_patch_that_is_not_an_object_is_refused(api: Api, body: bytes) -> None:
    created = api.admin.post("/v1/resourceflavors", json={"metadata": {"name": "f"}, "spec": {}})
    assert created.status_code == 201, created.text
    answer = api.admin.patch(
        "/v1/resourceflavors/f",
        content=body,
        headers={"Content-Type": "application/merge-patch+json", "If-Match": "null"},
    )
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
