"""kubevirt.io/v1 VirtualMachine and VirtualMachineInstance, as submitted by users."""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from events.api.base import ApiStruct, ObjectMeta
from events.api.domain import DomainSpec, Volume
from events.api.scheduling import Affinity, Toleration, TopologySpreadConstraint

API_VERSION: Final = "kubevirt.io/v1"
DEFAULT_GRACE_PERIOD_SECONDS: Final = 180
"""KubeVirt's default terminationGracePeriodSeconds for a VMI."""

RUN_STRATEGIES: Final = ("Always", "Halted", "Manual", "RerunOnFailure", "Once",
                         "WaitAsReceiver")
SUPPORTED_RUN_STRATEGIES: Final = ("Always", "Halted", "Manual", "RerunOnFailure", "Once")


class PodDNSConfigOption(ApiStruct):
    name: str = ""
    value: str | None = None


class PodDNSConfig(ApiStruct):
    """Resolver settings merged into what `dnsPolicy` gives the guest's pod network."""

    nameservers: list[str] = []
    searches: list[str] = []
    options: list[PodDNSConfigOption] = []


class VirtualMachineInstanceSpec(ApiStruct):
    domain: DomainSpec
    volumes: list[Volume] = []
    networks: list[dict[str, Any]] = []
    node_selector: dict[str, str] = {}
    affinity: Affinity | None = None
    tolerations: list[Toleration] = []
    topology_spread_constraints: list[TopologySpreadConstraint] = []
    termination_grace_period_seconds: int | None = None
    eviction_strategy: str | None = None
    hostname: str = ""
    dns_policy: str = ""
    dns_config: PodDNSConfig | None = None
    subdomain: str = ""
    scheduler_name: str = ""
    priority_class_name: str = ""
    start_strategy: str = ""
    architecture: str = ""
    access_credentials: list[dict[str, Any]] = []
    resource_claims: list[dict[str, Any]] = []
    """DRA claims (pod `resourceClaims`) the VMI's devices name; with a GPUsWithDRA /
    HostDevicesWithDRA device only."""
    readiness_probe: dict[str, Any] | None = None
    liveness_probe: dict[str, Any] | None = None

    @property
    def grace_period_seconds(self) -> int:
        t = self.termination_grace_period_seconds
        return DEFAULT_GRACE_PERIOD_SECONDS if t is None else t


class VirtualMachineInstanceTemplateSpec(ApiStruct):
    spec: VirtualMachineInstanceSpec
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class Matcher(ApiStruct):
    """`spec.instancetype` / `spec.preference`: which object, and the revision of it the VM is
    pinned to. `revisionName` absent keeps the pin a controller set, as kubectl apply keeps a
    field its user never wrote; `""` clears it, and the next start captures the object anew."""

    name: str = ""
    kind: str = ""
    revision_name: str | None = None
    infer_from_volume: str = ""
    infer_from_volume_failure_policy: str | None = None


class VirtualMachineSpec(ApiStruct):
    template: VirtualMachineInstanceTemplateSpec
    running: bool | None = None
    run_strategy: str | None = None
    instancetype: Matcher | None = None
    preference: Matcher | None = None
    data_volume_templates: list[dict[str, Any]] = []

    @property
    def effective_run_strategy(self) -> str:
        """`runStrategy`, else `running` mapped as KubeVirt does, else Halted."""
        if self.run_strategy is not None:
            return self.run_strategy
        if self.running is None:
            return "Halted"
        return "Always" if self.running else "Halted"

    def with_revisions(self, instancetype: str, preference: str) -> VirtualMachineSpec:
        """This spec with its matchers pinned to these revisions ('' leaves one as it is)."""
        spec = self
        if instancetype and spec.instancetype is not None:
            spec = msgspec.structs.replace(spec, instancetype=msgspec.structs.replace(
                spec.instancetype, revision_name=instancetype))
        if preference and spec.preference is not None:
            spec = msgspec.structs.replace(spec, preference=msgspec.structs.replace(
                spec.preference, revision_name=preference))
        return spec


class VirtualMachine(ApiStruct):
    metadata: ObjectMeta
    spec: VirtualMachineSpec
    api_version: str = API_VERSION
    kind: Literal["VirtualMachine"] = "VirtualMachine"
    status: dict[str, Any] | None = None


class VirtualMachineInstance(ApiStruct):
    metadata: ObjectMeta
    spec: VirtualMachineInstanceSpec
    api_version: str = API_VERSION
    kind: Literal["VirtualMachineInstance"] = "VirtualMachineInstance"
    status: dict[str, Any] | None = None


INFO_SOURCE_DOMAIN: Final = "domain"
"""KubeVirt's `infoSource` for what the node knows without asking the guest (its domain,
and here its DHCP lease); `guest-agent` is what the guest agent says."""


class VirtualMachineInstanceNetworkInterface(ApiStruct):
    """One entry of a VMI's `status.interfaces`, in KubeVirt's shape (`ipAddress` is always
    the first of `ipAddresses`)."""

    name: str = ""
    """The spec interface's (and its network's) name."""
    mac: str = ""
    ip_address: str = ""
    ip_addresses: list[str] = []
    interface_name: str = ""
    """The guest's own name for it (`eth0`): only a guest agent knows."""
    info_source: str = ""
