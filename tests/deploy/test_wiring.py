"""The central service's wiring: what each part is told and what it may reach.

* The ConfigMap holds settings that exist, none of them secret, at the
  defaults the code has, and they pass the settings' own validation.
* Each container gets exactly the Secret keys its part needs (the worker no
  signing key, the migration alone the owner's URL), by keys the operator's
  guide lists, and in dev every key it needs exists.
* NetworkPolicies, evaluated for the pods' real labels: denied by default;
  each part reaches Postgres, Redis, DNS and members only as it needs, and
  nothing else; only the API and the schedulers' metrics take connections.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from pydantic_settings import BaseSettings

from service.config import Settings
from tests.deploy.manifests import (
    OVERLAYS,
    ROOT,
    Obj,
    component,
    containers,
    find,
    of_kind,
    pods,
    render,
    selects,
)
from workers.settings import WorkerSettings

CENTRAL = pytest.mark.parametrize("overlay", sorted(OVERLAYS))
GUIDE = ROOT / "docs" / "operations.md"
CENTRAL_BASE = ROOT / "deploy" / "central" / "base"
#: Read by the QM_SECRET_KEY rotation (docs/operations.md), beside QM_SECRET_KEY.
ROTATION = "QM_SECRET_KEY_PREVIOUS"
SECRET_SETTINGS = {
    "QM_DATABASE_URL",
    "QM_BROKER_URL",
    "QM_SECRET_KEY",
    ROTATION,
    "QM_LEDGER_SIGNING_KEY",
    "QM_BOOTSTRAP_TOKEN",
    "QM_RATE_LIMIT_REDIS_URL",
}
#: The Secret keys a part reads, by variable; the migration reads the owner's URL.
APP, OWNER = "quartermaster", "quartermaster-migrate"
KEYS = {
    "QM_DATABASE_URL": "database-url",
    "QM_BROKER_URL": "broker-url",
    "QM_SECRET_KEY": "secret-key",
    ROTATION: "secret-key-previous",
    "QM_LEDGER_SIGNING_KEY": "ledger-signing-key",
    "QM_BOOTSTRAP_TOKEN": "bootstrap-token",
}
OPTIONAL = {ROTATION, "QM_BOOTSTRAP_TOKEN"}
#: What each container (by name) is given from Secrets: least privilege.
NEEDS = {
    "wait-for-migrations": {"QM_DATABASE_URL"},
    "migrate": {"QM_DATABASE_URL"},
    "api": set(KEYS),
    "scheduler": set(KEYS) - {"QM_BOOTSTRAP_TOKEN"},
    "worker": set(KEYS) - {"QM_BOOTSTRAP_TOKEN", "QM_LEDGER_SIGNING_KEY"},
}


def _variables(settings: type[BaseSettings]) -> dict[str, Any]:
    prefix = str(settings.model_config.get("env_prefix") or "").upper()
    return {f"{prefix}{name.upper()}": field for name, field in settings.model_fields.items()}


KNOWN = {**_variables(Settings), **_variables(WorkerSettings)}


def _settings_of(data: Mapping[str, str]) -> list[tuple[Any, Any, dict[str, str]]]:
    """Each settings class parsed from the map's values (strings, as from the
    environment; their validators run), with its defaults and its keys."""
    parsed = []
    for settings in (Settings, WorkerSettings):
        mine = {n[3:].lower(): v for n, v in data.items() if n[3:].lower() in settings.model_fields}
        # model_validate: the values alone, never this process's environment
        parsed.append((settings.model_validate(mine), settings.model_validate({}), mine))
    return parsed


def test_the_bases_configmap_holds_the_codes_defaults() -> None:
    data = find(list(render(CENTRAL_BASE)), "ConfigMap", "quartermaster-config")["data"]
    for parsed, defaults, mine in _settings_of(data):
        assert {k: getattr(parsed, k) for k in mine} == {k: getattr(defaults, k) for k in mine}


@CENTRAL
def test_the_configmap_holds_real_settings_and_none_secret(overlay: str) -> None:
    data = find(list(render(OVERLAYS[overlay])), "ConfigMap", "quartermaster-config")["data"]
    assert set(data) - KNOWN.keys() == set(), "not settings"
    assert set(data) & SECRET_SETTINGS == set(), "secrets belong in Secrets"
    assert _settings_of(data)


def _env(container: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {e["name"]: e for e in container.get("env") or ()}


def _from_secret(entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
    source = entry.get("valueFrom") or {}
    reference = source.get("secretKeyRef")
    return reference if isinstance(reference, Mapping) else None


def _secret_refs(objects: tuple[Obj, ...]) -> Iterable[tuple[str, str, str, Mapping[str, Any]]]:
    """(container, variable, Secret without kustomize's hash suffix, reference)."""
    for _, template in pods(objects):
        for _, container in containers(template):
            for name, entry in _env(container).items():
                ref = _from_secret(entry)
                if ref is not None:
                    base = re.sub(r"-[a-z0-9]{10}$", "", ref["name"])
                    yield container["name"], name, base, ref


@CENTRAL
def test_each_container_gets_exactly_the_secrets_its_part_needs(overlay: str) -> None:
    objects = render(OVERLAYS[overlay])
    given: dict[str, set[str]] = {}
    for part, name, secret, ref in _secret_refs(objects):
        given.setdefault(part, set()).add(name)
        expected = (OWNER if part == "migrate" else APP, KEYS[name], name in OPTIONAL)
        assert (secret, ref["key"], bool(ref.get("optional"))) == expected, (part, name)
    assert given == NEEDS
    for _, template in pods(objects):
        for _, container in containers(template):
            literal = {
                n for n, e in _env(container).items() if n in SECRET_SETTINGS and "value" in e
            }
            assert literal == set(), f"{container['name']}: secrets as literals"
            if container["name"] in NEEDS:
                assert all("secretRef" not in s for s in container.get("envFrom") or ())


def test_the_guide_lists_every_secret_key_the_parts_read() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index("## Secrets")
    section = text[start : text.index("\n## ", start + 1)]
    listed = set(re.findall(r"^\| `([a-z-]+)` \| `([a-z-]+)` \| `(QM_[A-Z_]+)`", section, re.M))
    read = {(s, ref["key"], n) for _, n, s, ref in _secret_refs(render(OVERLAYS["production"]))}
    assert read == listed


def test_dev_generates_every_key_the_parts_require() -> None:
    objects = render(OVERLAYS["dev"])
    secrets = {s["metadata"]["name"]: set(s.get("data") or ()) for s in of_kind(objects, "Secret")}
    missing = []
    for workload, template in pods(objects):
        for _, container in containers(template):
            for entry in container.get("env") or ():
                ref = _from_secret(entry)
                if (
                    ref
                    and not ref.get("optional")
                    and ref["key"] not in secrets.get(ref["name"], ())
                ):
                    missing.append(f"{workload['metadata']['name']}: {ref}")
    assert missing == []


@CENTRAL
def test_every_variable_the_manifests_set_is_a_setting(overlay: str) -> None:
    names = set()
    for _, template in pods(render(OVERLAYS[overlay])):
        for _, container in containers(template):
            names |= {n for n in _env(container) if n.startswith("QM_")}
    assert names - KNOWN.keys() - {ROTATION} == set()


# --- NetworkPolicies ----------------------------------------------------------------------

DNS = {("UDP", 53), ("TCP", 53)}
POSTGRES, REDIS = ("TCP", 5432), ("TCP", 6379)
MEMBERS = {("TCP", 443), ("TCP", 6443)}
ANY = ("*", "*")
EGRESS = {
    "api": DNS | {POSTGRES, REDIS},
    "scheduler": DNS | {POSTGRES, REDIS} | MEMBERS,
    "worker": DNS | {POSTGRES, REDIS} | MEMBERS,
    "migrate": DNS | {POSTGRES},
    "postgres": DNS,
    "redis": DNS,
}
INGRESS = {
    "api": {("TCP", 8080)},
    "scheduler": {("TCP", 9101)},
    "worker": set(),
    "migrate": set(),
    "postgres": {POSTGRES},
    "redis": {REDIS},
}


def _ports(rule: Mapping[str, Any]) -> set[tuple[str, Any]]:
    ports = rule.get("ports")
    if not ports:
        return {ANY}
    return {(p.get("protocol", "TCP"), p["port"]) for p in ports}


def _rules(policies: Iterable[Obj], labels: Mapping[str, str], direction: str) -> list[Obj]:
    """The rules that allow ``direction`` traffic of a pod with ``labels``;
    None of them and no policy of that type: everything is allowed."""
    kind = direction.capitalize()
    chosen = [
        p
        for p in policies
        if kind in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], labels)
    ]
    assert chosen, f"no {kind} policy selects {dict(labels)}: not denied by default"
    return [rule for p in chosen for rule in p["spec"].get(direction) or ()]


def _peer_is(peer: Mapping[str, Any], labels: Mapping[str, str] | None) -> bool:
    """Whether a peer names a pod of our namespace with ``labels`` (None: an
    address outside the cluster)."""
    if labels is None:
        return "ipBlock" in peer
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer and not selects(
        peer["namespaceSelector"], {"kubernetes.io/metadata.name": "quartermaster"}
    ):
        return False
    return selects(peer.get("podSelector"), labels)


def _allowed(
    rules: list[Obj], peers: str, port: tuple[str, int], other: Mapping[str, str] | None
) -> bool:
    return any(
        (port in _ports(rule) or ANY in _ports(rule))
        and (not rule.get(peers) or any(_peer_is(p, other) for p in rule[peers]))
        for rule in rules
    )


def _labels_by_part(objects: tuple[Obj, ...]) -> dict[str, Mapping[str, str]]:
    return {component(w): t["metadata"]["labels"] for w, t in pods(objects)}


@CENTRAL
def test_each_part_may_send_and_take_only_what_it_needs(overlay: str) -> None:
    objects = render(OVERLAYS[overlay])
    policies = of_kind(objects, "NetworkPolicy")
    parts = _labels_by_part(objects)
    assert set(parts) == set(EGRESS) - ({"postgres", "redis"} if overlay == "production" else set())
    for part, labels in parts.items():
        egress = set().union(*(_ports(r) for r in _rules(policies, labels, "egress")))
        ingress = set().union(*(_ports(r) for r in _rules(policies, labels, "ingress")))
        assert (part, egress) == (part, EGRESS[part])
        assert (part, ingress) == (part, INGRESS[part])


def _reaches(
    policies: list[Obj],
    source: Mapping[str, str],
    target: Mapping[str, str] | None,
    port: tuple[str, int],
) -> bool:
    out = _allowed(_rules(policies, source, "egress"), "to", port, target)
    if target is None:
        return out
    return out and _allowed(_rules(policies, target, "ingress"), "from", port, source)


def test_in_dev_the_parts_reach_their_databases_and_nothing_else_does() -> None:
    objects = render(OVERLAYS["dev"])
    policies = of_kind(objects, "NetworkPolicy")
    parts = _labels_by_part(objects)
    for part in ("api", "scheduler", "worker", "migrate"):
        assert _reaches(policies, parts[part], parts["postgres"], POSTGRES), part
        assert not _reaches(policies, parts[part], None, POSTGRES), f"{part}: Postgres elsewhere"
    for part in ("api", "scheduler", "worker"):
        assert _reaches(policies, parts[part], parts["redis"], REDIS), part
    assert not _reaches(policies, parts["migrate"], parts["redis"], REDIS)
    assert not _reaches(policies, parts["worker"], parts["api"], ("TCP", 8080)), (
        "workers call no API"
    )
    assert not _reaches(policies, parts["api"], None, ("TCP", 443)), "the API reaches no member"
    assert _reaches(policies, parts["worker"], None, ("TCP", 6443)), "workers reach members"


def test_in_production_the_databases_are_outside_and_the_api_behind_the_ingress() -> None:
    objects = render(OVERLAYS["production"])
    policies = of_kind(objects, "NetworkPolicy")
    parts = _labels_by_part(objects)
    for part in ("api", "scheduler", "worker", "migrate"):
        assert _reaches(policies, parts[part], None, POSTGRES), part
    api_from = [p for r in _rules(policies, parts["api"], "ingress") for p in r.get("from") or ()]
    assert api_from, "the API takes connections from the Ingress controller and Prometheus only"
    assert all("namespaceSelector" in p and p["namespaceSelector"] for p in api_from)
