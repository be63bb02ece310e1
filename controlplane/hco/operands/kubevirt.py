"""The KubeVirt CR: where most of the HyperConverged spec ends up.

See README.md, "KubeVirt", for the field-by-field mapping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from controlplane.hco import tls
from controlplane.hco.operands.base import (
    JSON,
    ClusterInfo,
    Operand,
    cert_config,
    compact,
    eviction_strategy,
    placement,
    to_json,
)
from controlplane.hco.tuning import rate_limits
from events.api import hco_defaults as d
from events.api.hco import (
    FeatureGates,
    HyperConverged,
    HyperConvergedConfig,
    HyperConvergedSpec,
    MediatedHostDevice,
    PciHostDevice,
    PermittedHostDevices,
    USBHostDevice,
)

_Device = TypeVar("_Device", PciHostDevice, MediatedHostDevice, USBHostDevice)

# Always on: HCO sets these and the user cannot turn them off.
MANDATORY_FEATURE_GATES: Final = (
    "DataVolumes",
    "SRIOV",
    "CPUManager",
    "CPUNodeDiscovery",
    "Snapshot",
    "HotplugVolumes",
    "ExpandDisks",
    "GPU",
    "HostDevices",
    "NUMA",
    "VMExport",
    "DisableCustomSELinuxPolicy",
    "KubevirtSeccompProfile",
    "HotplugNICs",
    "VMPersistentState",
    "NetworkBindingPlugins",
    "CommonInstancetypesDeploymentGate",
    "WithHostModelCPU",
    "HypervStrictCheck",
)
# HCO gate attribute -> KubeVirt gate; gates not listed belong to other operands.
MAPPED_FEATURE_GATES: Final = {
    "downward_metrics": "DownwardMetrics",
    "persistent_reservation": "PersistentReservation",
    "auto_resource_limits": "AutoResourceLimitsGate",
    "align_cpus": "AlignCPUs",
}
EMULATOR_THREAD_EVEN_PARITY_ANNOTATION: Final = (
    "alpha.kubevirt.io/EmulatorThreadCompleteToEvenParity"
)
DISK_VERIFICATION_MEMORY_LIMIT: Final = "2G"
SECCOMP_LOCALHOST_PROFILE: Final = "kubevirt/kubevirt.json"


def feature_gates(gates: FeatureGates) -> list[str]:
    enabled = [kv for attr, kv in MAPPED_FEATURE_GATES.items() if getattr(gates, attr)]
    return [*MANDATORY_FEATURE_GATES, *enabled]


def _component_config(config: HyperConvergedConfig, highly_available: bool) -> JSON | None:
    component: JSON = {}
    if not highly_available:
        component["replicas"] = 1
    if (node_placement := placement(config.node_placement)) is not None:
        component["nodePlacement"] = node_placement
    return component or None


def _allowed(devices: list[_Device], selector: Callable[[_Device], JSON]) -> list[JSON]:
    """Enabled devices only: HCO keeps disabled ones in its spec instead of removing them."""
    return [
        selector(dev)
        | {
            "resourceName": dev.resource_name,
            "externalResourceProvider": dev.external_resource_provider,
        }
        for dev in devices
        if not dev.disabled
    ]


def _permitted_host_devices(devices: PermittedHostDevices | None) -> JSON | None:
    if devices is None:
        return None
    return {
        "pciHostDevices": _allowed(
            devices.pci_host_devices, lambda dev: {"pciVendorSelector": dev.pci_device_selector}
        ),
        "mediatedDevices": _allowed(
            devices.mediated_devices, lambda dev: {"mdevNameSelector": dev.mdev_name_selector}
        ),
        "usbHostDevices": _allowed(
            devices.usb_host_devices, lambda dev: {"selectors": to_json(dev.selectors)}
        ),
    }


def _developer_configuration(spec: HyperConvergedSpec) -> JSON:
    log = spec.log_verbosity_config
    return compact(
        {
            "featureGates": feature_gates(spec.feature_gates),
            "cpuAllocationRatio": spec.resource_requirements.vmi_cpu_allocation_ratio,
            "memoryOvercommit": spec.higher_workload_density.memory_overcommit_percentage,
            "diskVerification": {"memoryLimit": DISK_VERIFICATION_MEMORY_LIMIT},
            "logVerbosity": to_json(log.kubevirt) if log and log.kubevirt else None,
        }
    )


def _migrations(spec: HyperConvergedSpec) -> JSON:
    lm = spec.live_migration_config
    return compact(
        {
            "parallelMigrationsPerCluster": lm.parallel_migrations_per_cluster,
            "parallelOutboundMigrationsPerNode": lm.parallel_outbound_migrations_per_node,
            "bandwidthPerMigration": lm.bandwidth_per_migration,
            "completionTimeoutPerGiB": lm.completion_timeout_per_gib,
            "progressTimeout": lm.progress_timeout,
            "network": lm.network,
            "allowAutoConverge": lm.allow_auto_converge,
            "allowPostCopy": lm.allow_post_copy,
        }
    )


def _virtual_machine_options(spec: HyperConvergedSpec) -> JSON | None:
    options = spec.virtual_machine_options
    flags = {
        "disableFreePageReporting": options.disable_free_page_reporting,
        "disableSerialConsoleLog": options.disable_serial_console_log,
    }
    return {name: {} for name, on in flags.items() if on} or None


def _obsolete_cpus(spec: HyperConvergedSpec) -> tuple[dict[str, bool], str | None]:
    extra = spec.obsolete_cpus.cpu_models if spec.obsolete_cpus else []
    models = dict.fromkeys([*d.HARDCODED_OBSOLETE_CPU_MODELS, *extra], True)
    min_model = spec.obsolete_cpus.min_cpu_model if spec.obsolete_cpus else ""
    return models, min_model or None


def _configuration(hco: HyperConverged, cluster: ClusterInfo) -> JSON:
    spec = hco.spec
    limits = rate_limits(hco)
    rest_client = (
        {
            "restClient": {
                "rateLimiter": {
                    "tokenBucketRateLimiter": {"qps": limits.qps, "burst": limits.burst}
                }
            }
        }
        if limits
        else None
    )
    obsolete, min_cpu_model = _obsolete_cpus(spec)
    selector = spec.resource_requirements.auto_cpu_limit_namespace_label_selector
    return compact(
        {
            "developerConfiguration": _developer_configuration(spec),
            "network": compact(
                {
                    "defaultNetworkInterface": "masquerade",
                    "binding": to_json(spec.network_binding) or None,
                }
            ),
            "migrations": _migrations(spec),
            "evictionStrategy": eviction_strategy(hco, cluster),
            "cpuModel": spec.default_cpu_model,
            "obsoleteCPUModels": obsolete,
            "minCPUModel": min_cpu_model,
            "permittedHostDevices": _permitted_host_devices(spec.permitted_host_devices),
            "mediatedDevicesConfiguration": to_json(spec.mediated_devices_configuration),
            "defaultRuntimeClass": spec.default_runtime_class,
            "vmStateStorageClass": spec.vm_state_storage_class,
            "ksmConfiguration": to_json(spec.ksm_configuration),
            "tlsConfiguration": tls.kubevirt_tls_configuration(spec),
            "apiConfiguration": rest_client,
            "webhookConfiguration": rest_client,
            "controllerConfiguration": rest_client,
            "handlerConfiguration": rest_client,
            "seccompConfiguration": {
                "virtualMachineInstanceProfile": {
                    "customProfile": {"localhostProfile": SECCOMP_LOCALHOST_PROFILE}
                }
            },
            "virtualMachineOptions": _virtual_machine_options(spec),
            "autoCPULimitNamespaceLabelSelector": to_json(selector),
        }
    )


def _spec(hco: HyperConverged, cluster: ClusterInfo) -> JSON:
    spec = hco.spec
    return compact(
        {
            "uninstallStrategy": spec.uninstall_strategy,
            "infra": _component_config(spec.infra, cluster.highly_available),
            "workloads": _component_config(spec.workloads, highly_available=True),
            "configuration": _configuration(hco, cluster),
            "certificateRotateStrategy": {"selfSigned": cert_config(spec.cert_config)},
            "workloadUpdateStrategy": compact(
                {
                    "workloadUpdateMethods": list(
                        spec.workload_update_strategy.workload_update_methods
                    )
                    or None,
                    "batchEvictionSize": spec.workload_update_strategy.batch_eviction_size,
                    "batchEvictionInterval": spec.workload_update_strategy.batch_eviction_interval,
                }
            ),
        }
    )


def _annotations(hco: HyperConverged) -> dict[str, str]:
    if hco.spec.feature_gates.align_cpus:
        return {EMULATOR_THREAD_EVEN_PARITY_ANNOTATION: ""}
    return {}


KUBEVIRT = Operand(
    kind="KubeVirt",
    api_version=d.OPERAND_API_VERSIONS["KubeVirt"],
    component="compute",
    jsonpatch_annotation=d.KUBEVIRT_JSONPATCH_ANNOTATION,
    name=lambda hco: f"kubevirt-{hco.metadata.name}",
    namespaced=True,
    spec=_spec,
    annotations=_annotations,
)
