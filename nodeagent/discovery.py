"""What this host offers, reported at agent start and whenever its fingerprint changes.

Capacity follows the kubelet and virt-handler: CPUs and memory from libvirt's node info,
hugepages per size from the NUMA cells of the capabilities, the kvm and tun device-plugin
resources at their configured count, and pods. Allocatable memory excludes hugepages, as
the kubelet's does, because those pages cannot back ordinary memory.
"""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import libvirt
import msgspec
import structlog

from events.api.hco_defaults import HARDCODED_OBSOLETE_CPU_MODELS, KUBEVIRT_MIN_CPU_MODEL
from events.api.node import (
    RESOURCE_CPU,
    RESOURCE_MEMORY,
    RESOURCE_PODS,
    NodeInfo,
    hugepages_resource,
    kib_quantity,
)
from events.api.resources import KVM_DEVICE, TUN_DEVICE
from nodeagent.defaults import (
    AGENT_VERSION,
    DEVICE_PLUGIN_CAPACITY,
    HUGEPAGE_SIZES_KIB,
    MAX_PODS,
)
from nodeagent.hostcpu import CpuMap, cpu_labels, host_cpu, labelled_features, labelled_models

log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class DiscoveryConfig:
    """Per-node settings; `obsolete_cpu_models` adds to the hard-coded list, never replaces it.

    `host_cpu_model` names the CPU a driver without one (the test driver) should report;
    real hosts ignore it because libvirt names their CPU.
    """

    node_name: str
    kvm_devices: int = DEVICE_PLUGIN_CAPACITY
    tun_devices: int = DEVICE_PLUGIN_CAPACITY
    max_pods: int = MAX_PODS
    obsolete_cpu_models: frozenset[str] = frozenset()
    min_cpu_model: str = KUBEVIRT_MIN_CPU_MODEL
    host_cpu_model: str = ""
    agent_version: str = AGENT_VERSION
    domain_type: str = ""
    """What guests here are defined as (`nodeagent.hypervisor`); '' takes libvirt's best."""
    cpus: int = 0
    """A simulated host's size, over what the test driver says (it has 16 CPUs and 3 GiB for
    every host); 0 keeps libvirt's figure."""
    memory_bytes: int = 0

    def device_capacity(self) -> dict[str, int]:
        """Device-plugin resources this node has, for the `DeviceLedger`."""
        return {KVM_DEVICE: self.kvm_devices, TUN_DEVICE: self.tun_devices}

    def obsolete(self) -> frozenset[str]:
        return frozenset(HARDCODED_OBSOLETE_CPU_MODELS) | self.obsolete_cpu_models


def discover_host(conn: libvirt.virConnect, cfg: DiscoveryConfig) -> NodeInfo:
    """Everything the control plane needs to schedule onto this host."""
    caps = ET.fromstring(conn.getCapabilities())
    arch = caps.findtext("host/cpu/arch", "")
    domain_type = cfg.domain_type or _domain_type(caps)
    cpu_map = CpuMap(conn, arch, domain_type)
    host = host_cpu(conn, cpu_map, cfg.host_cpu_model)
    obsolete = cfg.obsolete()
    models = labelled_models(host, obsolete)
    features = labelled_features(host, cpu_map.min_model_features(cfg.min_cpu_model))
    capacity, allocatable = _capacity(conn, caps, cfg, domain_type)
    major, rest = divmod(conn.getLibVersion(), 1_000_000)
    info = NodeInfo(
        node_name=cfg.node_name,
        hostname=conn.getHostname(),
        architecture=arch,
        hypervisor_uri=conn.getURI(),
        domain_type=domain_type,
        libvirt_version=f"{major}.{rest // 1000}.{rest % 1000}",
        capacity=capacity,
        allocatable=allocatable,
        labels=cpu_labels(host, models, features, obsolete),
        host_cpu_model=host.model,
        cpu_vendor=host.vendor,
        cpu_models=models,
        cpu_features=features,
        agent_version=cfg.agent_version,
    )
    log.info("host discovered", node=cfg.node_name, capacity=capacity, cpu_model=host.model)
    return info


def host_fingerprint(info: NodeInfo) -> str:
    """Stable digest of a `NodeInfo`: re-report only when it changes."""
    return hashlib.sha256(msgspec.json.encode(info, order="sorted")).hexdigest()


def _domain_type(caps: ET.Element) -> str:
    """The accelerated type where the host has one (kvm), else what the driver offers."""
    types = [str(d.get("type")) for d in caps.iterfind("guest/arch/domain")]
    return "kvm" if "kvm" in types else next(iter(types), "")


def _hugepages_kib(caps: ET.Element, size_kib: int) -> int:
    """Pages of one size pre-allocated across all NUMA cells, in KiB."""
    cells = caps.iterfind(f"host/topology/cells/cell/pages[@size='{size_kib}']")
    return size_kib * sum(int(pages.text or 0) for pages in cells)


def _capacity(
    conn: libvirt.virConnect, caps: ET.Element, cfg: DiscoveryConfig, domain_type: str
) -> tuple[dict[str, str], dict[str, str]]:
    """As the kubelet counts them; no `devices.kubevirt.io/kvm` where guests are emulated
    (KubeVirt's kvm device plugin has no healthy device without a usable /dev/kvm)."""
    _, memory_mib, cpus, *_ = conn.getInfo()
    cpus = cfg.cpus or cpus
    memory_kib = cfg.memory_bytes // 1024 or memory_mib * 1024
    hugepages = {size: _hugepages_kib(caps, size) for size in HUGEPAGE_SIZES_KIB}
    capacity = {
        RESOURCE_CPU: str(cpus),
        RESOURCE_MEMORY: kib_quantity(memory_kib),
        **{hugepages_resource(size): kib_quantity(kib) for size, kib in hugepages.items()},
        KVM_DEVICE: str(0 if domain_type == "qemu" else cfg.kvm_devices),
        TUN_DEVICE: str(cfg.tun_devices),
        RESOURCE_PODS: str(cfg.max_pods),
    }
    allocatable_kib = max(memory_kib - sum(hugepages.values()), 0)
    return capacity, {**capacity, RESOURCE_MEMORY: kib_quantity(allocatable_kib)}
