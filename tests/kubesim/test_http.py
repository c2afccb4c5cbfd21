"""The HTTP layer's per-request details: audit ids and query parameters."""

from __future__ import annotations

import json
import uuid

from kubernetes import client


def _get(api: client.ApiClient, path: str, query: list[tuple[str, str]]) -> tuple[str, object]:
    params = api.param_serialize(
        method="GET",
        resource_path=path,
        query_params=query,
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*params)
    response.read()
    assert response.status == 200, response.data
    return str(response.getheader("audit-id")), json.loads(response.data)


def test_audit_ids_are_distinct_version_4_uuids(api: client.ApiClient) -> None:
    ids = [_get(api, "/api/v1/namespaces", [])[0] for _ in range(20)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_the_last_of_repeated_query_parameters_counts_every_time(api: client.ApiClient) -> None:
    path = "/api/v1/namespaces"
    for _ in range(2):
        _, page = _get(api, path, [("limit", "500"), ("limit", "1")])
        assert isinstance(page, dict) and len(page["items"]) == 1
        _, everything = _get(api, path, [("limit", "1"), ("limit", "")])
        assert isinstance(everything, dict) and len(everything["items"]) > 1
