"""Host discovery against libvirt's test driver and libvirt's own CPU map."""

from __future__ import annotations

import libvirt
import pytest

from events.api.errors import InvalidSpec
from events.api.hco_defaults import HARDCODED_OBSOLETE_CPU_MODELS
from events.api.node import (
    CPU_FEATURE_LABEL,
    CPU_MODEL_LABEL,
    HOST_MODEL_CPU_LABEL,
    NFD_CPU_FEATURE_LABEL,
    NFD_CPU_MODEL_LABEL,
    hugepages_resource,
    kib_quantity,
)
from events.api.resources import KVM_DEVICE, TUN_DEVICE
from nodeagent.discovery import DiscoveryConfig, discover_host, host_fingerprint
from nodeagent.hostcpu import CpuMap, from_domain_capabilities

DOMCAPS = """
<domainCapabilities><arch>x86_64</arch><cpu>
  <mode name='host-model' supported='yes'>
    <model fallback='forbid'>Haswell</model><vendor>Intel</vendor>
    <feature policy='require' name='vmx'/>
    <feature policy='disable' name='hle'/>
  </mode>
  <mode name='custom' supported='yes'>
    <model usable='yes' vendor='Intel'>Penryn</model>
    <model usable='yes' vendor='Intel'>Haswell</model>
    <model usable='yes' vendor='Intel'>kvm64</model>
    <model usable='no' vendor='Intel'>Skylake-Server</model>
  </mode>
</cpu></domainCapabilities>
"""


def test_capacity_is_what_the_test_driver_reports(conn: libvirt.virConnect) -> None:
    info = discover_host(conn, DiscoveryConfig(node_name="n1"))
    _, memory_mib, cpus, *_ = conn.getInfo()
    assert info.capacity == {
        "cpu": str(cpus),
        "memory": kib_quantity(memory_mib * 1024),
        "hugepages-2Mi": "0",
        "hugepages-1Gi": "0",
        KVM_DEVICE: "110",
        TUN_DEVICE: "110",
        "pods": "110",
    }
    assert info.allocatable == info.capacity
    assert info.hypervisor_uri == "test:///default"
    assert info.domain_type == "test"
    major, minor = divmod(libvirt.getVersion() // 1000, 1000)
    assert info.libvirt_version.startswith(f"{major}.{minor}.")


def test_device_counts_are_configurable(conn: libvirt.virConnect) -> None:
    cfg = DiscoveryConfig(node_name="n1", kvm_devices=3, tun_devices=5)
    info = discover_host(conn, cfg)
    assert (info.capacity[KVM_DEVICE], info.capacity[TUN_DEVICE]) == ("3", "5")
    assert cfg.device_capacity() == {KVM_DEVICE: 3, TUN_DEVICE: 5}


def test_test_driver_names_no_cpu_model(conn: libvirt.virConnect) -> None:
    info = discover_host(conn, DiscoveryConfig(node_name="n1"))
    assert info.host_cpu_model == ""
    assert info.cpu_models == []
    assert not any(k.startswith(CPU_MODEL_LABEL) for k in info.labels)


def test_declared_cpu_labels_skip_obsolete_models(conn: libvirt.virConnect) -> None:
    info = discover_host(conn, DiscoveryConfig(node_name="n1", host_cpu_model="Haswell"))
    assert {"Penryn", "Nehalem", "Haswell"} <= set(info.cpu_models)
    assert not set(info.cpu_models) & set(HARDCODED_OBSOLETE_CPU_MODELS)
    assert "Skylake-Server" not in info.cpu_models  # needs features Haswell lacks
    assert info.labels[CPU_MODEL_LABEL + "Haswell"] == "true"
    assert info.labels[NFD_CPU_MODEL_LABEL + "Haswell"] == "true"
    assert info.labels[HOST_MODEL_CPU_LABEL + "Haswell"] == "true"
    assert CPU_MODEL_LABEL + "Conroe" not in info.labels


def test_configured_obsolete_models_add_to_the_hardcoded_list(conn: libvirt.virConnect) -> None:
    cfg = DiscoveryConfig(
        node_name="n1", host_cpu_model="Haswell", obsolete_cpu_models=frozenset({"Nehalem"})
    )
    info = discover_host(conn, cfg)
    assert "Nehalem" not in info.cpu_models
    assert "Conroe" not in info.cpu_models
    assert "Penryn" in info.cpu_models


def test_feature_labels_leave_out_the_min_cpu_models_features(conn: libvirt.virConnect) -> None:
    info = discover_host(conn, DiscoveryConfig(node_name="n1", host_cpu_model="Haswell"))
    penryn = CpuMap(conn, info.architecture, info.domain_type).features("Penryn")
    assert {"sse4.1", "ssse3", "lm"} <= penryn
    assert not set(info.cpu_features) & penryn
    assert {"avx", "avx2", "sse4.2"} <= set(info.cpu_features)
    assert info.labels[CPU_FEATURE_LABEL + "avx2"] == "true"
    assert info.labels[NFD_CPU_FEATURE_LABEL + "avx2"] == "true"
    assert CPU_FEATURE_LABEL + "sse4.1" not in info.labels


def test_a_higher_min_cpu_model_removes_more_features(conn: libvirt.virConnect) -> None:
    cfg = DiscoveryConfig(node_name="n1", host_cpu_model="Haswell", min_cpu_model="Haswell")
    assert discover_host(conn, cfg).cpu_features == []


def test_unknown_min_cpu_model_is_refused(conn: libvirt.virConnect) -> None:
    cfg = DiscoveryConfig(node_name="n1", min_cpu_model="NoSuchCPU")
    with pytest.raises(InvalidSpec, match="minCPUModel"):
        discover_host(conn, cfg)


def test_domain_capabilities_give_host_model_and_usable_models(conn: libvirt.virConnect) -> None:
    host = from_domain_capabilities(DOMCAPS, CpuMap(conn, "x86_64", "test"))
    assert (host.model, host.vendor) == ("Haswell", "Intel")
    assert host.usable_models == ("Penryn", "Haswell", "kvm64")
    assert "vmx" in host.features
    assert "hle" not in host.features
    assert "avx2" in host.features


def test_fingerprint_changes_only_with_the_host(conn: libvirt.virConnect) -> None:
    cfg = DiscoveryConfig(node_name="n1")
    first = host_fingerprint(discover_host(conn, cfg))
    assert host_fingerprint(discover_host(conn, cfg)) == first
    changed = DiscoveryConfig(node_name="n1", kvm_devices=7)
    assert host_fingerprint(discover_host(conn, changed)) != first


@pytest.mark.parametrize(
    ("kib", "quantity"), [(0, "0"), (2048, "2Mi"), (1048576, "1Gi"), (3 * 1024 + 1, "3073Ki")]
)
def test_quantities_use_the_largest_exact_unit(kib: int, quantity: str) -> None:
    assert kib_quantity(kib) == quantity


def test_hugepage_resource_names_match_kubernetes() -> None:
    assert hugepages_resource(2048) == "hugepages-2Mi"
    assert hugepages_resource(1048576) == "hugepages-1Gi"


def test_a_models_features_are_kept_for_the_process_never_with_extras(
        conn: libvirt.virConnect) -> None:
    """Rediscovery (every minute per node, a hundred nodes in a fleet) reads each model's
    features from the process's cache, the same as libvirt gives them: a model asked with
    extra features is not kept as the model's own."""
    with_extra = CpuMap(conn, "x86_64", "test").features("Westmere", ["avx512f"])
    assert "avx512f" in with_extra
    plain = CpuMap(conn, "x86_64", "test").features("Westmere")
    assert "avx512f" not in plain and plain < with_extra
    config = DiscoveryConfig(node_name="n1", host_cpu_model="Haswell")
    assert discover_host(conn, config) == discover_host(conn, config)
