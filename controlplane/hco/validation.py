"""Admission rules for the HyperConverged, as HCO's webhook enforces them.

Every rule raises `InvalidSpec(field, rule)`; the first broken rule wins, in the order of
`validate_hco`. Rules the type system already enforces (enums, unknown fields) are left to
decoding.

Uninstall (`check_uninstall`):

| uninstallStrategy              | VMs exist | deletion                                  |
|--------------------------------|-----------|-------------------------------------------|
| BlockUninstallIfWorkloadsExist | yes       | refused                                   |
| BlockUninstallIfWorkloadsExist | no        | proceed                                   |
| RemoveWorkloads                | any       | remove-workloads: VMs are deleted with it |
"""

from __future__ import annotations

import ipaddress
import re
from datetime import timedelta
from typing import Literal

from controlplane.hco import jsonpatch, tuning
from controlplane.hco.duration import parse_go_duration
from events.api import hco_defaults as d
from events.api.errors import InvalidSpec
from events.api.hco import HyperConverged, HyperConvergedSpec

_MIN_CERT = parse_go_duration(d.MIN_CERT_DURATION)
_QUANTITY = re.compile(
    r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(\d+(\.\d*)?|\.\d+)))?$"
)


def validate_hco(
    hco: HyperConverged, *, vms_exist: bool, previous: HyperConvergedSpec | None
) -> None:
    """Refuse a HyperConverged (new, or replacing `previous`) that breaks a rule."""
    spec = hco.spec
    _validate_certs(spec)
    _validate_resources(spec)
    _validate_live_migration(spec)
    _validate_misc(spec)
    tuning.rate_limits(hco)
    _validate_jsonpatch(hco)
    if vms_exist and previous is not None and previous.workloads != spec.workloads:
        raise InvalidSpec(
            "spec.workloads.nodePlacement",
            "cannot change while virtual machines exist; remove them first",
        )


def check_uninstall(
    hco: HyperConverged, *, vms_exist: bool
) -> Literal["proceed", "remove-workloads"]:
    """Whether deleting the HyperConverged may go ahead, per the table above."""
    if hco.spec.uninstall_strategy == "RemoveWorkloads":
        return "remove-workloads"
    if vms_exist:
        raise InvalidSpec(
            "spec.uninstallStrategy",
            "BlockUninstallIfWorkloadsExist: delete the virtual machines first, or set "
            "RemoveWorkloads to have them deleted with the HyperConverged",
        )
    return "proceed"


def _duration(field: str, text: str) -> timedelta:
    try:
        value = parse_go_duration(text)
    except ValueError as exc:
        raise InvalidSpec(field, f"must be a Go duration like 48h0m0s: {exc}") from exc
    if value < _MIN_CERT:
        raise InvalidSpec(field, f"must be at least {d.MIN_CERT_DURATION}")
    return value


def _validate_certs(spec: HyperConvergedSpec) -> None:
    base = "spec.certConfig"
    certs = spec.cert_config
    ca = _duration(f"{base}.ca.duration", certs.ca.duration)
    ca_renew = _duration(f"{base}.ca.renewBefore", certs.ca.renew_before)
    server = _duration(f"{base}.server.duration", certs.server.duration)
    server_renew = _duration(f"{base}.server.renewBefore", certs.server.renew_before)
    if ca_renew >= ca:
        raise InvalidSpec(f"{base}.ca.renewBefore", "must be less than ca.duration")
    if server >= ca:
        raise InvalidSpec(f"{base}.server.duration", "must be less than ca.duration")
    if server_renew >= server:
        raise InvalidSpec(f"{base}.server.renewBefore", "must be less than server.duration")


def _validate_resources(spec: HyperConvergedSpec) -> None:
    resources = spec.resource_requirements
    ratio = resources.vmi_cpu_allocation_ratio
    if ratio <= 0:
        raise InvalidSpec(
            "spec.resourceRequirements.vmiCPUAllocationRatio", "must be greater than 0"
        )
    if resources.auto_cpu_limit_namespace_label_selector is not None and ratio == 1:
        raise InvalidSpec(
            "spec.resourceRequirements.autoCPULimitNamespaceLabelSelector",
            "cannot be used with vmiCPUAllocationRatio 1: VM pods could use more than "
            "1 CPU per vCPU",
        )
    overcommit = spec.higher_workload_density.memory_overcommit_percentage
    if overcommit < d.MIN_MEMORY_OVERCOMMIT_PERCENTAGE:
        raise InvalidSpec(
            "spec.higherWorkloadDensity.memoryOvercommitPercentage",
            f"must be at least {d.MIN_MEMORY_OVERCOMMIT_PERCENTAGE}",
        )


def _validate_live_migration(spec: HyperConvergedSpec) -> None:
    lm = spec.live_migration_config
    base = "spec.liveMigrationConfig"
    bandwidth = lm.bandwidth_per_migration
    if bandwidth is not None and not _QUANTITY.match(bandwidth):
        raise InvalidSpec(f"{base}.bandwidthPerMigration", "must be a quantity like 2048Mi")
    for name, value in (
        ("parallelMigrationsPerCluster", lm.parallel_migrations_per_cluster),
        ("parallelOutboundMigrationsPerNode", lm.parallel_outbound_migrations_per_node),
        ("completionTimeoutPerGiB", lm.completion_timeout_per_gib),
        ("progressTimeout", lm.progress_timeout),
    ):
        if value <= 0:
            raise InvalidSpec(f"{base}.{name}", "must be greater than 0")


def _validate_misc(spec: HyperConvergedSpec) -> None:
    strategy = spec.workload_update_strategy
    base = "spec.workloadUpdateStrategy"
    try:
        parse_go_duration(strategy.batch_eviction_interval)
    except ValueError as exc:
        raise InvalidSpec(
            f"{base}.batchEvictionInterval", f"must be a Go duration: {exc}"
        ) from exc
    if strategy.batch_eviction_size <= 0:
        raise InvalidSpec(f"{base}.batchEvictionSize", "must be greater than 0")
    if (ip := spec.kube_secondary_dns_name_server_ip) and not _is_ipv4(ip):
        raise InvalidSpec("spec.kubeSecondaryDNSNameServerIP", "must be an IPv4 address")
    mdevs = spec.mediated_devices_configuration
    if mdevs is not None and not mdevs.mediated_device_types:
        raise InvalidSpec(
            "spec.mediatedDevicesConfiguration.mediatedDeviceTypes", "must not be empty"
        )
    profile = spec.tls_security_profile
    if profile is not None and profile.type == "Custom" and profile.custom is None:
        raise InvalidSpec("spec.tlsSecurityProfile.custom", "is required when type is Custom")


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _validate_jsonpatch(hco: HyperConverged) -> None:
    """Refuse an annotation that is not an RFC 6902 patch of `/spec`. A well-formed patch
    that does not apply is accepted: the controller reports it on the conditions and leaves
    the operand as it was, as HCO does."""
    annotations = hco.metadata.annotations
    for name in jsonpatch.present(annotations):
        patch = jsonpatch.parse(name, annotations[name])
        if isinstance(patch, jsonpatch.PatchFailure):
            raise InvalidSpec(f"metadata.annotations[{name}]", patch.reason)
