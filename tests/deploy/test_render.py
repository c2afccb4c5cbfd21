"""Every kustomization under deploy/ renders, and every object it renders is
valid for Kubernetes: built-in kinds against the strict JSON schemas of the
``kubernetes-validate`` package (unknown fields refused), at the release
members run today (``service.app.kube_schemas.KUBERNETES_VERSION``) and the
newest the package carries; custom kinds against the ``openAPIV3Schema`` of
their CRD, bundled in tests/deploy/crds (README there: where from).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema_rs
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as validate_utils

from service.app.kube_schemas import KUBERNETES_VERSION, _structural, schema_problems
from tests.deploy.manifests import OVERLAYS, kustomizations, label, name_of, render

CRDS = Path(__file__).parent / "crds"
#: (apiVersion, kind) of custom objects → their CRD file here.
CUSTOM = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml"
}
VERSIONS = sorted({KUBERNETES_VERSION, validate_utils.latest_version()})


@functools.cache
def _crd_validator(api_version: str, kind: str) -> Any:
    """The CRD's served schema, read as the API server reads a structural
    schema (the project's reading, service/app/kube_schemas.py): unknown
    fields refused unless kept, metadata checked by the API server itself."""
    crd = yaml.safe_load((CRDS / CUSTOM[(api_version, kind)]).read_text(encoding="utf-8"))
    version = api_version.rsplit("/", 1)[1]
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version and v["served"])
    schema = _structural(served["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta, checked below
    return jsonschema_rs.validator_for(schema)


def problems(obj: dict[str, Any], version: str) -> list[str]:
    """Why ``obj`` would be refused (empty: it would not)."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key in CUSTOM:
        errors = _crd_validator(*key).iter_errors(obj)
        found = [f"{'.'.join(map(str, e.instance_path))}: {e.message}" for e in errors]
        meta = schema_problems("ObjectMeta", obj.get("metadata") or {}, "metadata")
        return found + [f"{path}: {message}" for path, message in meta]
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{'.'.join(map(str, error.path))}: {error.message}"]
    except validate_utils.SchemaNotFoundError as error:
        return [f"no schema: {error.message} (bundle its CRD in tests/deploy/crds)"]
    return []


@pytest.mark.parametrize("path", kustomizations(), ids=label)
def test_renders(path: Path) -> None:
    objects = render(path)
    assert objects, f"{label(path)} renders nothing"
    names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), "an object rendered twice"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", kustomizations(), ids=label)
def test_every_object_is_valid_for_kubernetes(path: Path, version: str) -> None:
    found = {name_of(o): problems(o, version) for o in render(path)}
    assert {name: p for name, p in found.items() if p} == {}


def test_dev_keeps_postgres_on_a_volume_and_redis_with_its_append_only_file() -> None:
    objects = render(OVERLAYS["dev"])
    sets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}
    assert set(sets) == {"postgres", "redis"}
    for stateful in sets.values():
        claims = {c["metadata"]["name"] for c in stateful["spec"]["volumeClaimTemplates"]}
        (container,) = stateful["spec"]["template"]["spec"]["containers"]
        assert claims <= {m["name"] for m in container["volumeMounts"]}, "data on the claim"
    args = sets["redis"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"


def test_production_runs_no_database_and_serves_through_an_ingress_with_tls() -> None:
    objects = render(OVERLAYS["production"])
    kinds = {o["kind"] for o in objects}
    assert "StatefulSet" not in kinds, "production's Postgres and Redis are yours"
    assert not [o for o in objects if o["kind"] == "Secret"], "no credentials in the repository"
    (ingress,) = [o for o in objects if o["kind"] == "Ingress"]
    hosts = {rule["host"] for rule in ingress["spec"]["rules"]}
    assert hosts <= {h for tls in ingress["spec"]["tls"] for h in tls["hosts"]}
    assert {"ServiceMonitor"} <= kinds


def _first(objects: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(o for o in objects if o["kind"] == kind))


def test_the_checks_refuse_an_unknown_field_and_a_wrong_type() -> None:
    objects = render(OVERLAYS["production"])
    deployment = _first(objects, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFilesystem"] = True
    monitor = _first(objects, "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["interval"] = 30
    monitor_field = _first(objects, "ServiceMonitor")
    monitor_field["spec"]["endpoint"] = monitor_field["spec"].pop("endpoints")
    monitor_meta = _first(objects, "ServiceMonitor")
    monitor_meta["metadata"]["label"] = {"a": "b"}
    for broken in (deployment, monitor, monitor_field, monitor_meta):
        assert problems(broken, VERSIONS[-1]), name_of(broken)
