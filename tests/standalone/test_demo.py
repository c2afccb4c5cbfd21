"""The demo manifests agree with the demo fleet the stand-ins serve."""

from __future__ import annotations

from service.domain.manifests import resource_flavor_from_manifest, topology_from_manifest
from service.runtime.demo import load_manifests
from service.runtime.standalone import DEMO_FLEET, DEMO_QUOTAS
from sim.fleet import load_fleet


def test_demo_flavors_and_topology_are_the_fleets() -> None:
    fleet = load_fleet(DEMO_FLEET)
    manifests = load_manifests(DEMO_QUOTAS)
    flavors = [resource_flavor_from_manifest(m) for m in manifests if m["kind"] == "ResourceFlavor"]
    topologies = [topology_from_manifest(m) for m in manifests if m["kind"] == "Topology"]
    assert sorted(flavors, key=lambda f: f.name) == sorted(
        fleet.resource_flavors, key=lambda f: f.name
    )
    assert topologies == list(fleet.topologies)


def test_demo_manifests_come_in_dependency_order() -> None:
    kinds = [m["kind"] for m in load_manifests(DEMO_QUOTAS)]
    assert kinds.index("ResourceFlavor") < kinds.index("ClusterQueue") < kinds.index("LocalQueue")
    assert kinds.count("ClusterQueue") == 3
    assert all(
        m["spec"]["namespaceSelector"] == {}
        for m in load_manifests(DEMO_QUOTAS)
        if m["kind"] == "ClusterQueue"
    )
