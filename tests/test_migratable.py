"""KubeVirt's LiveMigratable verdict, from the spec alone (reasons as KubeVirt names them)."""

from __future__ import annotations

from typing import Any

import pytest

from events.api.manifest import decode_object
from events.api.vm import VirtualMachineInstance
from projections.migratable import migration_data_bytes, not_migratable


def vmi(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> VirtualMachineInstance:
    base: dict[str, Any] = {"domain": {"resources": {"requests": {"memory": "1Gi"}}}}
    doc = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "v", "annotations": annotations or {}},
           "spec": {**base, **spec}}
    obj = decode_object(doc)
    assert isinstance(obj, VirtualMachineInstance)
    return obj


BRIDGE = {"networks": [{"name": "default", "pod": {}}],
          "domain": {"resources": {"requests": {"memory": "1Gi"}},
                     "devices": {"interfaces": [{"name": "default", "bridge": {}}]}}}


@pytest.mark.parametrize(("spec", "reason"), [
    ({}, None),
    ({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}],
      "domain": {"resources": {"requests": {"memory": "1Gi"}},
                 "devices": {"disks": [{"name": "d", "disk": {}}]}}}, "DisksNotLiveMigratable"),
    (BRIDGE, "InterfaceNotLiveMigratable"),
    ({"domain": {"resources": {"requests": {"memory": "1Gi"}},
                 "devices": {"gpus": [{"name": "g", "deviceName": "nvidia.com/A10"}]}}},
     "HostDeviceNotLiveMigratable"),
])
def test_reasons(spec: dict[str, Any], reason: str | None) -> None:
    got = not_migratable(vmi(spec).spec, {})
    assert (got.reason if got else None) == reason


def test_the_bridge_annotation_allows_a_pod_bridge() -> None:
    allowed = vmi(BRIDGE, {"kubevirt.io/allow-pod-bridge-network-live-migration": ""})
    assert not_migratable(allowed.spec, allowed.metadata.annotations) is None


def test_copied_disks_count_toward_the_data() -> None:
    spec = vmi({"volumes": [{"name": "scratch", "emptyDisk": {"capacity": "2Gi"}}],
                "domain": {"resources": {"requests": {"memory": "1Gi"}},
                           "devices": {"disks": [{"name": "scratch", "disk": {}}]}}}).spec
    assert migration_data_bytes(spec) == 3 * 2**30
