"""What one node agent is told at start (`python -m nodeagent run`, a fleet's node)."""

from __future__ import annotations

import msgspec

from events.jetstream.connect import Access
from events.language.subjects import DEFAULT_PREFIX
from nodeagent.converter import defaults as converter_defaults
from nodeagent.defaults import (
    AGENT_VERSION,
    BRIDGE,
    DEVICE_PLUGIN_CAPACITY,
    DOWNWARD_METRICS_INTERVAL_SECONDS,
    HYPERVISOR_PROBE_SECONDS,
    IMAGE_DIR,
    MIGRATION_REPORT_INTERVAL_SECONDS,
    NETWORK_DIR,
    POD_SUBNET,
    READ_SERVICE_WAIT_SECONDS,
    REDISCOVERY_INTERVAL_SECONDS,
    SIMULATED_BANDWIDTH_BYTES_PER_SECOND,
    SIMULATED_DIRTY_RATE_BYTES_PER_SECOND,
    TEST_DEFAULT_URI,
)
from nodeagent.hypervisor import HypervisorChoice


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    nats_url: str
    nats_credentials: str = ""
    """Paths, as in `events.jetstream.connect.Access`: the secrets stay in their files."""
    nats_ca: str = ""
    nats_cert: str = ""
    nats_key: str = ""
    prefix: str = DEFAULT_PREFIX
    libvirt_uri: str = TEST_DEFAULT_URI
    kvm_devices: int = DEVICE_PLUGIN_CAPACITY
    tun_devices: int = DEVICE_PLUGIN_CAPACITY
    host_cpu_model: str = ""
    """'' means: libvirt's own, or `TEST_HOST_CPU_MODEL` on the test driver."""
    disk_dir: str = converter_defaults.DISK_DIR
    image_dir: str = IMAGE_DIR
    """The node's image store: containerDisk and kernelBoot images (`--image-dir`)."""
    rediscovery_seconds: float = REDISCOVERY_INTERVAL_SECONDS
    downward_metrics_seconds: float = DOWNWARD_METRICS_INTERVAL_SECONDS
    read_service_wait_seconds: float = READ_SERVICE_WAIT_SECONDS
    sim_state: str = ""
    """A file to keep the test driver's host in (`--sim-state`); '' keeps it in memory."""
    agent_version: str = AGENT_VERSION
    sim_migration_bandwidth: int = SIMULATED_BANDWIDTH_BYTES_PER_SECOND
    """Bytes per second of the test driver's simulated migration link."""
    sim_dirty_rate: int = SIMULATED_DIRTY_RATE_BYTES_PER_SECOND
    """Bytes per second a simulated guest dirties, unless its VMI's annotation says."""
    migration_report_seconds: float = MIGRATION_REPORT_INTERVAL_SECONDS
    migration_address: str = ""
    """Where a real host takes migrations in (its libvirtd and QEMU listen there); '' is
    its host name, as libvirt itself picks when told none."""
    hypervisor: HypervisorChoice = "auto"
    """`kvm` or `qemu` as told, or `auto`: KVM if the probe finds it runs guests."""
    hypervisor_probe_seconds: float = HYPERVISOR_PROBE_SECONDS
    sim_cpus: int = 0
    """A simulated host's CPUs (`nodeagent fleet --cpu`); 0 keeps the test driver's."""
    sim_memory: int = 0
    """A simulated host's memory in bytes (`nodeagent fleet --memory`); 0 keeps the driver's."""
    bridge: str = BRIDGE
    """A real host's guests' bridge (`nodeagent.network`)."""
    pod_subnet: str = POD_SUBNET
    network_dir: str = NETWORK_DIR

    @property
    def access(self) -> Access:
        return Access(self.nats_url, credentials=self.nats_credentials, ca=self.nats_ca,
                      cert=self.nats_cert, key=self.nats_key)
