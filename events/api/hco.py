"""The HyperConverged object (hco.kubevirt.io/v1beta1): the cluster configuration, one per cluster.

`HyperConvergedSpec()` with no arguments is the spec with every default of the HCO
cluster-configuration seed (the constants live in `events.api.hco_defaults`). Go-style
optional pointers are `None`; omit_defaults keeps the wire form as small as what was written.
Fields whose Go JSON name is not plain camelCase (`vmiCPUAllocationRatio`, `minCPUModel`,
...) are named explicitly.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from events.api import hco_defaults as d
from events.api.base import ApiStruct, ObjectMeta
from events.api.kinds import Kind, declare
from events.api.scheduling import LabelSelector, Toleration

UninstallStrategy = Literal["BlockUninstallIfWorkloadsExist", "RemoveWorkloads"]
EvictionStrategy = Literal["None", "LiveMigrate", "LiveMigrateIfPossible", "External"]
TuningPolicy = Literal["annotation", "highBurst"]
WorkloadUpdateMethod = Literal["LiveMigrate", "Evict"]
VmiCalcConfigName = Literal[
    "VmiPodUsage", "VirtualResources", "DedicatedVirtualResources", "IgnoreVmiCalculator"
]
TLSProfileType = Literal["Old", "Intermediate", "Modern", "Custom"]


class NodePlacement(ApiStruct):
    """Where the pods of a kind go (for `workloads`: every VMI, see `controlplane.scheduling`);
    `affinity` is kept as the Kubernetes JSON it is, as HCO copies it into the KubeVirt CR."""

    node_selector: dict[str, str] = {}
    affinity: dict[str, object] | None = None
    tolerations: list[Toleration] = []


class HyperConvergedConfig(ApiStruct):
    node_placement: NodePlacement | None = None


class FeatureGates(ApiStruct):
    downward_metrics: bool = d.DOWNWARD_METRICS
    enable_common_boot_image_import: bool = d.ENABLE_COMMON_BOOT_IMAGE_IMPORT
    deploy_vm_console_proxy: bool = d.DEPLOY_VM_CONSOLE_PROXY
    deploy_kube_secondary_dns: bool = msgspec.field(
        default=d.DEPLOY_KUBE_SECONDARY_DNS, name="deployKubeSecondaryDNS"
    )
    persistent_reservation: bool = d.PERSISTENT_RESERVATION
    auto_resource_limits: bool = d.AUTO_RESOURCE_LIMITS
    align_cpus: bool = msgspec.field(default=d.ALIGN_CPUS, name="alignCPUs")
    enable_application_aware_quota: bool = d.ENABLE_APPLICATION_AWARE_QUOTA
    # Accepted for old manifests; HCO ignores it and so do we.
    with_host_passthrough_cpu: bool = msgspec.field(default=False, name="withHostPassthroughCPU")


class LiveMigrationConfig(ApiStruct):
    parallel_migrations_per_cluster: int = d.PARALLEL_MIGRATIONS_PER_CLUSTER
    parallel_outbound_migrations_per_node: int = d.PARALLEL_OUTBOUND_MIGRATIONS_PER_NODE
    bandwidth_per_migration: str | None = None
    completion_timeout_per_gib: int = msgspec.field(
        default=d.COMPLETION_TIMEOUT_PER_GIB, name="completionTimeoutPerGiB"
    )
    progress_timeout: int = d.PROGRESS_TIMEOUT
    network: str | None = None
    allow_auto_converge: bool = d.ALLOW_AUTO_CONVERGE
    allow_post_copy: bool = d.ALLOW_POST_COPY


class PciHostDevice(ApiStruct):
    pci_device_selector: str
    resource_name: str
    external_resource_provider: bool = False
    disabled: bool = False


class MediatedHostDevice(ApiStruct):
    mdev_name_selector: str
    resource_name: str
    external_resource_provider: bool = False
    disabled: bool = False


class USBSelector(ApiStruct):
    vendor: str
    product: str


class USBHostDevice(ApiStruct):
    resource_name: str
    selectors: list[USBSelector] = []
    external_resource_provider: bool = False
    disabled: bool = False


class PermittedHostDevices(ApiStruct):
    pci_host_devices: list[PciHostDevice] = []
    mediated_devices: list[MediatedHostDevice] = []
    usb_host_devices: list[USBHostDevice] = msgspec.field(default=[], name="usbHostDevices")


class NodeMediatedDeviceTypes(ApiStruct):
    node_selector: dict[str, str]
    mediated_device_types: list[str] = []


class MediatedDevicesConfiguration(ApiStruct):
    mediated_device_types: list[str] = []
    node_mediated_device_types: list[NodeMediatedDeviceTypes] = []


class FilesystemOverhead(ApiStruct):
    """Fractions as decimal strings ("0.055"), as CDI takes them."""

    global_: str | None = msgspec.field(default=None, name="global")
    storage_class: dict[str, str] = {}


class ResourceRequirements(ApiStruct):
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}


class OperandResourceRequirements(ApiStruct):
    storage_workloads: ResourceRequirements | None = None
    vmi_cpu_allocation_ratio: int = msgspec.field(
        default=d.VMI_CPU_ALLOCATION_RATIO, name="vmiCPUAllocationRatio"
    )
    auto_cpu_limit_namespace_label_selector: LabelSelector | None = msgspec.field(
        default=None, name="autoCPULimitNamespaceLabelSelector"
    )


class CertRotateConfigCA(ApiStruct):
    duration: str = d.CA_DURATION
    renew_before: str = d.CA_RENEW_BEFORE


class CertRotateConfigServer(ApiStruct):
    duration: str = d.SERVER_DURATION
    renew_before: str = d.SERVER_RENEW_BEFORE


class CertConfig(ApiStruct):
    ca: CertRotateConfigCA = msgspec.field(default_factory=CertRotateConfigCA)
    server: CertRotateConfigServer = msgspec.field(default_factory=CertRotateConfigServer)


class ObsoleteCPUs(ApiStruct):
    """Added to the hard-coded obsolete list, never replacing it."""

    cpu_models: list[str] = msgspec.field(default=[], name="cpuModels")
    min_cpu_model: str = msgspec.field(default="", name="minCPUModel")


class StorageImport(ApiStruct):
    insecure_registries: list[str] = []


class WorkloadUpdateStrategy(ApiStruct):
    """An explicitly empty `workloadUpdateMethods` means no automated workload updating."""

    workload_update_methods: list[WorkloadUpdateMethod] = msgspec.field(
        default_factory=lambda: list(d.WORKLOAD_UPDATE_METHODS)
    )
    batch_eviction_size: int = d.BATCH_EVICTION_SIZE
    batch_eviction_interval: str = d.BATCH_EVICTION_INTERVAL


class DataImportCronTemplate(ApiStruct):
    """A golden image: a custom one, or a common one named to disable or modify it."""

    metadata: ObjectMeta
    spec: dict[str, object] | None = None


class KubeVirtLogVerbosity(ApiStruct):
    virt_api: int | None = msgspec.field(default=None, name="virtAPI")
    virt_controller: int | None = None
    virt_handler: int | None = None
    virt_launcher: int | None = None
    virt_operator: int | None = None
    node_verbosity: dict[str, int] = {}


class LogVerbosityConfig(ApiStruct):
    kubevirt: KubeVirtLogVerbosity | None = None
    cdi: int | None = None


class InterfaceBindingPlugin(ApiStruct):
    sidecar_image: str = ""
    network_attachment_definition: str = ""
    domain_attachment_type: str = ""
    migration: dict[str, object] | None = None
    downward_api: str = msgspec.field(default="", name="downwardAPI")
    compute_resource_overhead: dict[str, object] | None = None


class VirtualMachineOptions(ApiStruct):
    disable_free_page_reporting: bool = d.DISABLE_FREE_PAGE_REPORTING
    disable_serial_console_log: bool = d.DISABLE_SERIAL_CONSOLE_LOG


class KSMConfiguration(ApiStruct):
    """`nodeLabelSelector` unset: KSM nowhere; empty: KSM on every node."""

    node_label_selector: LabelSelector | None = None


class TLSProfileSpec(ApiStruct):
    ciphers: list[str] = []
    min_tls_version: str = msgspec.field(default="", name="minTLSVersion")


class TLSSecurityProfile(ApiStruct):
    type: TLSProfileType
    old: dict[str, object] | None = None
    intermediate: dict[str, object] | None = None
    modern: dict[str, object] | None = None
    custom: TLSProfileSpec | None = None


class ApplicationAwareConfig(ApiStruct):
    vmi_calc_config_name: VmiCalcConfigName = d.VMI_CALC_CONFIG_NAME
    namespace_selector: LabelSelector | None = None
    allow_application_aware_cluster_resource_quota: bool = (
        d.ALLOW_APPLICATION_AWARE_CLUSTER_RESOURCE_QUOTA
    )


class HigherWorkloadDensity(ApiStruct):
    memory_overcommit_percentage: int = d.MEMORY_OVERCOMMIT_PERCENTAGE


class HyperConvergedSpec(ApiStruct):
    infra: HyperConvergedConfig = msgspec.field(default_factory=HyperConvergedConfig)
    workloads: HyperConvergedConfig = msgspec.field(default_factory=HyperConvergedConfig)
    feature_gates: FeatureGates = msgspec.field(default_factory=FeatureGates)
    live_migration_config: LiveMigrationConfig = msgspec.field(default_factory=LiveMigrationConfig)
    permitted_host_devices: PermittedHostDevices | None = None
    mediated_devices_configuration: MediatedDevicesConfiguration | None = None
    filesystem_overhead: FilesystemOverhead | None = None
    scratch_space_storage_class: str | None = None
    resource_requirements: OperandResourceRequirements = msgspec.field(
        default_factory=OperandResourceRequirements
    )
    cert_config: CertConfig = msgspec.field(default_factory=CertConfig)
    obsolete_cpus: ObsoleteCPUs | None = msgspec.field(default=None, name="obsoleteCPUs")
    default_cpu_model: str | None = msgspec.field(default=None, name="defaultCPUModel")
    default_runtime_class: str | None = None
    common_templates_namespace: str | None = None
    tekton_pipelines_namespace: str | None = None
    tekton_tasks_namespace: str | None = None
    workload_update_strategy: WorkloadUpdateStrategy = msgspec.field(
        default_factory=WorkloadUpdateStrategy
    )
    storage_import: StorageImport | None = None
    kube_secondary_dns_name_server_ip: str | None = msgspec.field(
        default=None, name="kubeSecondaryDNSNameServerIP"
    )
    network_binding: dict[str, InterfaceBindingPlugin] = {}
    data_import_cron_templates: list[DataImportCronTemplate] = []
    common_boot_image_namespace: str | None = None
    log_verbosity_config: LogVerbosityConfig | None = None
    uninstall_strategy: UninstallStrategy = d.UNINSTALL_STRATEGY
    eviction_strategy: EvictionStrategy | None = None
    vm_state_storage_class: str | None = None
    virtual_machine_options: VirtualMachineOptions = msgspec.field(
        default_factory=VirtualMachineOptions
    )
    ksm_configuration: KSMConfiguration | None = msgspec.field(
        default=None, name="ksmConfiguration"
    )
    tls_security_profile: TLSSecurityProfile | None = msgspec.field(
        default=None, name="tlsSecurityProfile"
    )
    application_aware_config: ApplicationAwareConfig | None = None
    higher_workload_density: HigherWorkloadDensity = msgspec.field(
        default_factory=HigherWorkloadDensity
    )
    tuning_policy: TuningPolicy | None = None


class Condition(ApiStruct):
    """metav1.Condition as HCO reports it."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int = 0


class HyperConvergedStatus(ApiStruct):
    conditions: list[Condition] = []
    observed_generation: int = 0
    system_health_status: str = ""


def _default_metadata() -> ObjectMeta:
    return ObjectMeta(name=d.DEFAULT_NAME, namespace=d.DEFAULT_NAMESPACE)


class HyperConverged(ApiStruct, omit_defaults=False):
    """Top level keeps its defaults on the wire: apiVersion and kind are always written."""

    api_version: Literal["hco.kubevirt.io/v1beta1"] = d.API_VERSION
    kind: Literal["HyperConverged"] = d.KIND
    metadata: ObjectMeta = msgspec.field(default_factory=_default_metadata)
    spec: HyperConvergedSpec = msgspec.field(default_factory=HyperConvergedSpec)
    status: HyperConvergedStatus = msgspec.field(default_factory=HyperConvergedStatus)


class OperandObject(ApiStruct):
    """An operand CR (KubeVirt, CDI, ...) as anyone may write it: HCO derives and owns its
    `spec`, which stays the free-form JSON of the operand's own API."""

    api_version: str
    kind: str
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: dict[str, Any] = {}
    status: dict[str, Any] = {}


def _declare(kind: str, api_version: str, manifest: type[ApiStruct], *,
             short_names: tuple[str, ...] = (), categories: tuple[str, ...] = (),
             namespaced: bool = True) -> Kind:
    """HCO's kinds are one object each for the whole cluster, decided at the cluster scope
    (their API scope is their CRDs': CDI and NetworkAddonsConfig are cluster-scoped); an
    operand's aggregate token is its kind, lower-cased."""
    group, _, version = api_version.partition("/")
    return declare(Kind(kind=kind, group=group, versions=(version,), plural=f"{kind.lower()}s",
                        token="hco" if kind == d.KIND else kind.lower(),
                        short_names=short_names, categories=categories, namespaced=namespaced,
                        one_per_cluster=True, manifest=manifest))


HYPERCONVERGED: Final = _declare(d.KIND, d.API_VERSION, HyperConverged,
                                 short_names=("hco", "hcos"))
OPERANDS: Final = {
    "KubeVirt": _declare("KubeVirt", d.OPERAND_API_VERSIONS["KubeVirt"], OperandObject,
                         short_names=("kv", "kvs"), categories=("all",)),
    "CDI": _declare("CDI", d.OPERAND_API_VERSIONS["CDI"], OperandObject,
                    short_names=("cdi", "cdis"), namespaced=False),
    "NetworkAddonsConfig": _declare("NetworkAddonsConfig",
                                    d.OPERAND_API_VERSIONS["NetworkAddonsConfig"],
                                    OperandObject, namespaced=False),
    "SSP": _declare("SSP", d.OPERAND_API_VERSIONS["SSP"], OperandObject),
}
"""The operand CRs HCO writes, one of each."""
