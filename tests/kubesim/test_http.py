"""The HTTP layer's per-request details: audit ids and query parameters."""

from __future__ import annotations

import json
import uuid

from kubernetes import client

from service.jsonio import dumps
from sim.kubesim.testing import RunningCluster


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


def _raw(api: client.ApiClient, method: str, path: str, **kwargs: object) -> bytes:
    params = api.param_serialize(
        method=method,
        resource_path=path,
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        auth_settings=["BearerToken"],
        **kwargs,  # type: ignore[arg-type]
    )
    response = api.call_api(*params)
    response.read()
    assert response.status < 300, response.data
    return bytes(response.data)


def test_a_list_is_the_json_of_the_whole_list(sim: RunningCluster, api: client.ApiClient) -> None:
    """Items encoded once per stored object and spliced into the list: the same bytes as
    encoding the list, whatever GETs and writes cached before."""
    names = [f"spliced-{i}" for i in range(3)]
    for name in names:
        body = {"metadata": {"name": name, "labels": {"test": "spliced"}}}
        _raw(api, "POST", "/api/v1/namespaces", body=body)
    _raw(api, "GET", f"/api/v1/namespaces/{names[0]}")
    patch = {"metadata": {"labels": {"round": "2"}}}
    params = api.param_serialize(
        method="PATCH",
        resource_path=f"/api/v1/namespaces/{names[1]}",
        header_params={"Content-Type": "application/merge-patch+json"},
        body=patch,
        auth_settings=["BearerToken"],
    )
    api.call_api(*params).read()
    query = [("labelSelector", "test=spliced")]
    for _ in range(2):
        raw = _raw(api, "GET", "/api/v1/namespaces", query_params=query)
        listed = json.loads(raw)
        assert [i["metadata"]["name"] for i in listed["items"]] == names
        assert listed["items"][1]["metadata"]["labels"]["round"] == "2"
        rv = int(listed["metadata"]["resourceVersion"])
        assert raw == sim.run(_namespace_list, sim, names, rv)


def _namespace_list(sim: RunningCluster, names: list[str], rv: int) -> bytes:
    """The list of ``names`` at ``rv`` encoded whole (on the server's loop)."""
    core = sim.cluster.core
    resource = core.resource("", "v1", "namespaces")
    items = [
        core.present(resource, o)
        for o in core.store.items(resource.rtype)
        if o["metadata"]["name"] in names
    ]
    whole = {
        "kind": "NamespaceList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(rv)},
        "items": items,
    }
    return dumps(whole)


def test_a_get_after_a_write_shows_the_write(api: client.ApiClient) -> None:
    _raw(api, "POST", "/api/v1/namespaces", body={"metadata": {"name": "fresh-read"}})
    for value in ("a", "b", "c"):
        before = json.loads(_raw(api, "GET", "/api/v1/namespaces/fresh-read"))
        params = api.param_serialize(
            method="PATCH",
            resource_path="/api/v1/namespaces/fresh-read",
            header_params={"Content-Type": "application/merge-patch+json"},
            body={"metadata": {"labels": {"v": value}}},
            auth_settings=["BearerToken"],
        )
        answer = api.call_api(*params)
        answer.read()
        after = json.loads(_raw(api, "GET", "/api/v1/namespaces/fresh-read"))
        assert after == json.loads(answer.data)
        assert after["metadata"]["labels"]["v"] == value
        assert after["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
