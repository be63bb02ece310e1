"""KubeVirt's defaults for what a VMI spec leaves unset, where they change the guest.

KubeVirt's mutating webhook writes these into the VMI before admission and conversion; here
admission (`validation`) and the converter read them from this one place instead, and the
stored spec stays as the user wrote it.

| left unset                         | KubeVirt's default         | in KubeVirt                  |
|------------------------------------|----------------------------|------------------------------|
| a disk for a volume                | a disk of its name, `{}`   | SetDefaultVolumeDisk         |
| `disk.bus` / `cdrom.bus` (amd64)   | sata                       | setDefaultAmd64DisksBus      |
| `hyperv.spinlocks.spinlocks` (on)  | 4096                       | SetDefaults_FeatureSpinlocks |
| `cpu.features` with `hyperv.evmcs` | `vmx`, policy `require`    | setEVMCSDependency           |
| interfaces and networks (at create,| interface `default` with   | SetDefaultNetworkInterface   |
| unless `autoattachPodInterface:    | the cluster's binding, on  |                              |
| false`; stored in the VMI's spec)  | the pod network `default`  |                              |
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import msgspec

from events.api.domain import CPUFeature, Disk, Empty, Interface
from events.api.errors import InvalidSpec

if TYPE_CHECKING:
    from events.api.domain import CPU, Devices, FeatureHyperv, Volume
    from events.api.vm import VirtualMachineInstanceSpec

DISK_BUS: Final = "sata"
"""amd64's bus for a disk or cdrom without one: guests drive SATA out of the box."""
SPINLOCK_RETRIES: Final = 4096
"""Hyper-V spinlock retries when `spinlocks` is on without a count (libvirt needs one)."""
EVMCS_CPU_FEATURE: Final = CPUFeature(name="vmx", policy="require")
"""Enlightened VMCS is nested virtualisation: the guest must see VMX."""
POD_NETWORK: Final = "default"
"""The name of the pod network, and of the interface a VMI gets on it by default."""
POD_BINDINGS: Final = ("bridge", "masquerade")
"""The bindings KubeVirt's `network.defaultNetworkInterface` may name (slirp is gone)."""
DEFAULT_POD_BINDING: Final = "bridge"
"""KubeVirt's default binding where its configuration names none (HCO writes masquerade)."""


def vmi_disks(devices: Devices, volumes: list[Volume]) -> list[Disk]:
    """The spec's disks, then a plain disk for each volume that no disk names."""
    named = {disk.name for disk in devices.disks}
    return [*devices.disks, *(Disk(name=v.name) for v in volumes if v.name not in named)]


def spinlock_retries(hyperv: FeatureHyperv) -> int | None:
    """Retries for `<spinlocks>`: the spec's, else the default while spinlocks are on."""
    spinlocks = hyperv.spinlocks
    if spinlocks is None or spinlocks.enabled is False:
        return None
    return SPINLOCK_RETRIES if spinlocks.spinlocks is None else spinlocks.spinlocks


def evmcs_enabled(hyperv: FeatureHyperv | None) -> bool:
    return hyperv is not None and hyperv.evmcs is not None and hyperv.evmcs.enabled is not False


def cpu_features(cpu: CPU | None, hyperv: FeatureHyperv | None) -> list[CPUFeature]:
    """The spec's CPU features, with `vmx` required (added, or its policy overridden) when
    evmcs is on, as KubeVirt's webhook does."""
    features = list(cpu.features) if cpu is not None else []
    if not evmcs_enabled(hyperv):
        return features
    vmx = EVMCS_CPU_FEATURE
    if all(feature.name != vmx.name for feature in features):
        return [*features, vmx]
    return [vmx if feature.name == vmx.name else feature for feature in features]


def with_pod_interface(spec: VirtualMachineInstanceSpec,
                       binding: str) -> VirtualMachineInstanceSpec:
    """`spec` with KubeVirt's default interface, as its webhook stores it on a new VMI: one
    that lists no interface and no network, and does not opt out, gets interface `default`
    with the cluster's `binding` on the pod network."""
    devices = spec.domain.devices
    if devices.autoattach_pod_interface is False or devices.interfaces or spec.networks:
        return spec
    if binding not in POD_BINDINGS:
        raise InvalidSpec("spec.domain.devices.interfaces",
                          f"the cluster's default network interface {binding!r} is not one of "
                          f"{', '.join(POD_BINDINGS)}: list the VMI's interfaces")
    interface = (Interface(name=POD_NETWORK, masquerade=Empty()) if binding == "masquerade"
                 else Interface(name=POD_NETWORK, bridge=Empty()))
    domain = msgspec.structs.replace(
        spec.domain, devices=msgspec.structs.replace(devices, interfaces=[interface]))
    return msgspec.structs.replace(spec, domain=domain,
                                   networks=[{"name": POD_NETWORK, "pod": {}}])
