"""Admission by feature gate: a spec that uses a gated KubeVirt feature is refused while the
effective KubeVirt CR's `configuration.developerConfiguration.featureGates` lacks the gate,
as KubeVirt's VM and VMI admission webhooks refuse it.

| gate (HyperConverged `spec.featureGates`)      | VMI spec field that needs it             |
|------------------------------------------------|------------------------------------------|
| DownwardMetrics (`downwardMetrics`)            | `domain.devices.downwardMetrics`         |
| DownwardMetrics (`downwardMetrics`)            | `volumes[i].downwardMetrics`             |
| PersistentReservation (`persistentReservation`)| `domain.devices.disks[i].lun.reservation`|
| HostDevices (always on under HCO)              | `domain.devices.hostDevices`             |
| HostDisk                                       | `volumes[i].hostDisk`                    |
| GPUsWithDRA (Beta: on unless disabled)         | `domain.devices.gpus[i].claimName`       |
| HostDevicesWithDRA (Beta: on unless disabled)  | `domain.devices.hostDevices[i].claimName`|

GPU, NUMA and VMPersistentState (a persistent TPM) are GA in KubeVirt: no gate asks for them.

| gate (none in the HyperConverged: HCO's jsonpatch) | VMI annotation that needs it    |
|----------------------------------------------------|---------------------------------|
| Sidecar                                            | `hooks.kubevirt.io/hookSidecars`|

| command                          | spec fields under     | annotations under         | gate off |
|----------------------------------|-----------------------|---------------------------|----------|
| VirtualMachine apply             | `spec.template.spec.` | `spec.template.metadata.` | refused  |
| VirtualMachineInstance apply     | `spec.`               | `metadata.`               | refused  |
| VMI create-for-vm (controller)   | `spec.`               | `metadata.`               | + logged |

A refused command appends nothing. A VM admitted while its gate was on and whose gate is
turned off since gets its VMI refused, as KubeVirt's VMI webhook refuses it: the VM stays
without a VMI, decided again at its next change or the controllers' next resync
(control-plane start).

The first use found is reported (table order), like every other admission rule here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from controlplane.clusterconfig import (
    GPUS_WITH_DRA,
    HOST_DEVICES_WITH_DRA,
    ClusterConfig,
)
from controlplane.hco.operands.kubevirt import MAPPED_FEATURE_GATES
from events.api.errors import InvalidSpec

if TYPE_CHECKING:
    from collections.abc import Mapping

    from controlplane.decision import Decision
    from events.api.validation import VMISpecLike

VM_SPEC_PATH: Final = "spec.template.spec"
VMI_SPEC_PATH: Final = "spec"
VM_METADATA_PATH: Final = "spec.template.metadata"
VMI_METADATA_PATH: Final = "metadata"

DOWNWARD_METRICS: Final = MAPPED_FEATURE_GATES["downward_metrics"]
PERSISTENT_RESERVATION: Final = MAPPED_FEATURE_GATES["persistent_reservation"]
HOST_DEVICES: Final = "HostDevices"
"""One of HCO's `MANDATORY_FEATURE_GATES`: off only where no HyperConverged configures
KubeVirt."""
HOST_DISK: Final = "HostDisk"
SIDECAR: Final = "Sidecar"
HOOK_SIDECARS_ANNOTATION: Final = "hooks.kubevirt.io/hookSidecars"
"""Sidecar containers that rewrite the domain before it starts (KubeVirt's hook sidecars)."""


def _downward_metrics_device(spec: VMISpecLike) -> Iterator[str]:
    if spec.domain.devices.downward_metrics is not None:
        yield "domain.devices.downwardMetrics"


def _downward_metrics_volumes(spec: VMISpecLike) -> Iterator[str]:
    for index, volume in enumerate(spec.volumes):
        if volume.downward_metrics is not None:
            yield f"volumes[{index}].downwardMetrics"


def _lun_reservations(spec: VMISpecLike) -> Iterator[str]:
    for index, disk in enumerate(spec.domain.devices.disks):
        if disk.lun is not None and disk.lun.reservation:
            yield f"domain.devices.disks[{index}].lun.reservation"


def _host_devices(spec: VMISpecLike) -> Iterator[str]:
    if spec.domain.devices.host_devices:
        yield "domain.devices.hostDevices"


def _host_disks(spec: VMISpecLike) -> Iterator[str]:
    for index, volume in enumerate(spec.volumes):
        if volume.host_disk is not None:
            yield f"volumes[{index}].hostDisk"


def _dra_gpus(spec: VMISpecLike) -> Iterator[str]:
    for index, gpu in enumerate(spec.domain.devices.gpus):
        if gpu.claim_name:
            yield f"domain.devices.gpus[{index}].claimName"


def _dra_host_devices(spec: VMISpecLike) -> Iterator[str]:
    for index, device in enumerate(spec.domain.devices.host_devices):
        if device.claim_name:
            yield f"domain.devices.hostDevices[{index}].claimName"


GATED_FIELDS: Final[tuple[tuple[str, Callable[[VMISpecLike], Iterator[str]]], ...]] = (
    (DOWNWARD_METRICS, _downward_metrics_device),
    (DOWNWARD_METRICS, _downward_metrics_volumes),
    (PERSISTENT_RESERVATION, _lun_reservations),
    (HOST_DEVICES, _host_devices),
    (HOST_DISK, _host_disks),
    (GPUS_WITH_DRA, _dra_gpus),
    (HOST_DEVICES_WITH_DRA, _dra_host_devices),
)
"""Gate -> the fields (relative to the VMI spec) of a spec that use what it gates."""


GATED_ANNOTATIONS: Final = ((SIDECAR, HOOK_SIDECARS_ANNOTATION),)
"""Gate -> the VMI annotation whose non-empty value uses what it gates."""


def _field_uses(spec: VMISpecLike, path: str) -> list[tuple[str, str]]:
    return [(gate, f"{path}.{field}") for gate, fields in GATED_FIELDS for field in fields(spec)]


def _annotation_uses(annotations: Mapping[str, str], path: str) -> list[tuple[str, str]]:
    return [(gate, f"{path}.annotations.{annotation}")
            for gate, annotation in GATED_ANNOTATIONS if annotations.get(annotation)]


def _refuse_disabled(uses: list[tuple[str, str]], enabled: frozenset[str]) -> None:
    """Refuse the first (gate, field) use whose gate is not in `enabled`."""
    for gate, field in uses:
        if gate not in enabled:
            raise InvalidSpec(field, f"the {gate} feature gate is not enabled")


def check_feature_gates(spec: VMISpecLike, enabled: frozenset[str], path: str) -> None:
    """Refuse `spec` if it uses a gated feature whose gate is not in `enabled` (pure)."""
    _refuse_disabled(_field_uses(spec, path), enabled)


def check_annotation_gates(annotations: Mapping[str, str], enabled: frozenset[str],
                           path: str) -> None:
    """Refuse VMI `annotations` (at `path`) that ask for a gated feature whose gate is off."""
    _refuse_disabled(_annotation_uses(annotations, path), enabled)


def enabled_feature_gates(d: Decision) -> frozenset[str]:
    """The gates of the effective KubeVirt CR, on the decision's fresh state
    (`ClusterConfig.feature_gates`: the Beta ones on unless disabled)."""
    return ClusterConfig.of_decision(d).feature_gates


def admit_by_feature_gates(d: Decision, spec: VMISpecLike, path: str,
                           annotations: Mapping[str, str], metadata_path: str) -> None:
    """KubeVirt's gate checks at admission, against the cluster configuration of now: the
    spec's fields first, then the VMI's annotations. The configuration is read only when
    the spec uses a gated feature: no gate setting can refuse a spec that uses none, so its
    decision does not depend on the configuration (and carries no read guard on it)."""
    uses = _field_uses(spec, path) + _annotation_uses(annotations, metadata_path)
    if uses:
        _refuse_disabled(uses, enabled_feature_gates(d))
