"""The HyperConverged API: every seed section decodes, and defaults are the seed's."""

from __future__ import annotations

import msgspec
import pytest

from events.api import hco_defaults as d
from events.api.hco import (
    ApplicationAwareConfig,
    HyperConverged,
    HyperConvergedSpec,
    LabelSelector,
)
from tests.hco.manifests import load, spec


def test_object_identity_defaults() -> None:
    hco = HyperConverged()
    assert hco.api_version == "hco.kubevirt.io/v1beta1"
    assert hco.kind == "HyperConverged"
    assert hco.metadata.name == "kubevirt-hyperconverged"
    assert hco.metadata.namespace == "kubevirt-hyperconverged"


def test_wire_form_always_names_its_kind_and_round_trips() -> None:
    hco = HyperConverged()
    encoded = msgspec.json.decode(msgspec.json.encode(hco))
    assert encoded["apiVersion"] == "hco.kubevirt.io/v1beta1"
    assert encoded["kind"] == "HyperConverged"
    assert "parallelMigrationsPerCluster" not in msgspec.json.encode(hco).decode()
    assert msgspec.json.decode(msgspec.json.encode(hco), type=HyperConverged) == hco


def test_unknown_field_is_refused_by_name() -> None:
    with pytest.raises(msgspec.ValidationError, match="liveMigrationConfg"):
        spec("liveMigrationConfg: {}")


def test_feature_gate_defaults() -> None:
    gates = HyperConvergedSpec().feature_gates
    assert gates.downward_metrics is False
    assert gates.enable_common_boot_image_import is True
    assert gates.deploy_vm_console_proxy is False
    assert gates.deploy_kube_secondary_dns is False
    assert gates.persistent_reservation is False
    assert gates.auto_resource_limits is False
    assert gates.align_cpus is False
    assert gates.enable_application_aware_quota is False


def test_feature_gates_seed_example() -> None:
    hco = load(
        """
apiVersion: hco.kubevirt.io/v1beta1
kind: HyperConverged
metadata:
  name: kubevirt-hyperconverged
spec:
  infra: {}
  workloads: {}
  featureGates:
    enableCommonBootImageImport: true
    deployKubeSecondaryDNS: true
    enableApplicationAwareQuota: true
"""
    )
    gates = hco.spec.feature_gates
    assert gates.deploy_kube_secondary_dns and gates.enable_application_aware_quota
    assert hco.spec.infra.node_placement is None


def test_live_migration_defaults_are_the_seeds() -> None:
    lm = HyperConvergedSpec().live_migration_config
    assert lm.parallel_migrations_per_cluster == 5
    assert lm.parallel_outbound_migrations_per_node == 2
    assert lm.completion_timeout_per_gib == 800
    assert lm.progress_timeout == 150
    assert lm.bandwidth_per_migration is None
    assert lm.network is None
    assert lm.allow_auto_converge is False
    assert lm.allow_post_copy is False


def test_live_migration_seed_example() -> None:
    lm = spec(
        """
liveMigrationConfig:
  completionTimeoutPerGiB: 800
  network: migration-network
  parallelMigrationsPerCluster: 5
  parallelOutboundMigrationsPerNode: 2
  progressTimeout: 150
  allowAutoConverge: false
  allowPostCopy: false
"""
    ).spec.live_migration_config
    assert lm.network == "migration-network"


def test_node_placement_seed_examples() -> None:
    hco = spec(
        """
infra:
  nodePlacement:
    nodeSelector: {nodeType: infra}
workloads:
  nodePlacement:
    affinity:
      nodeAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
          nodeSelectorTerms:
          - matchExpressions:
            - {key: nodeType, operator: In, values: [nested-virtualization]}
    tolerations:
    - {key: "key", operator: "Equal", value: "kubevirt", effect: "NoSchedule"}
"""
    )
    assert hco.spec.infra.node_placement is not None
    assert hco.spec.infra.node_placement.node_selector == {"nodeType": "infra"}
    workloads = hco.spec.workloads.node_placement
    assert workloads is not None
    assert workloads.affinity is not None and "nodeAffinity" in workloads.affinity
    assert workloads.tolerations[0].effect == "NoSchedule"


def test_mediated_devices_seed_example() -> None:
    mdevs = spec(
        """
mediatedDevicesConfiguration:
  mediatedDeviceTypes: [nvidia-222, nvidia-228, i915-GVTg_V5_4]
  nodeMediatedDeviceTypes:
  - nodeSelector: {someLabel1: ""}
    mediatedDeviceTypes: [nvidia-222]
"""
    ).spec.mediated_devices_configuration
    assert mdevs is not None
    assert mdevs.node_mediated_device_types[0].node_selector == {"someLabel1": ""}


def test_permitted_host_devices_seed_example() -> None:
    devices = spec(
        """
permittedHostDevices:
  pciHostDevices:
  - pciDeviceSelector: "10DE:1DB6"
    resourceName: "nvidia.com/GV100GL_Tesla_V100"
  mediatedDevices:
  - mdevNameSelector: "GRID T4-1Q"
    resourceName: "nvidia.com/GRID_T4-1Q"
  usbHostDevices:
  - resourceName: kubevirt.io/peripherals
    selectors:
    - {vendor: "045e", product: "07a5"}
    externalResourceProvider: false
"""
    ).spec.permitted_host_devices
    assert devices is not None
    assert devices.pci_host_devices[0].external_resource_provider is False
    assert devices.usb_host_devices[0].selectors[0].product == "07a5"


def test_storage_sections_seed_examples() -> None:
    s = spec(
        """
filesystemOverhead:
  global: "0.1"
  storageClass: {nfs: "0"}
scratchSpaceStorageClass: aStorageClassName
resourceRequirements:
  storageWorkloads:
    limits: {cpu: "500m", memory: "2Gi"}
    requests: {cpu: "250m", memory: "1Gi"}
storageImport:
  insecureRegistries: ["private-registry-example-1:5000"]
vmStateStorageClass: rook-cephfs
"""
    ).spec
    assert s.filesystem_overhead is not None and s.filesystem_overhead.global_ == "0.1"
    assert s.scratch_space_storage_class == "aStorageClassName"
    assert s.resource_requirements.storage_workloads is not None
    assert s.resource_requirements.vmi_cpu_allocation_ratio == 10
    assert s.storage_import is not None
    assert s.vm_state_storage_class == "rook-cephfs"


def test_cpu_sections_seed_examples() -> None:
    s = spec(
        """
resourceRequirements:
  vmiCPUAllocationRatio: 16
  autoCPULimitNamespaceLabelSelector:
    matchLabels: {autocpulimit: "true"}
obsoleteCPUs:
  cpuModels: ["486", "pentium"]
  minCPUModel: "Penryn"
defaultCPUModel: "EPYC"
defaultRuntimeClass: "myCustomRuntimeClass"
"""
    ).spec
    assert s.resource_requirements.vmi_cpu_allocation_ratio == 16
    assert s.resource_requirements.auto_cpu_limit_namespace_label_selector == LabelSelector(
        match_labels={"autocpulimit": "true"}
    )
    assert s.obsolete_cpus is not None and s.obsolete_cpus.min_cpu_model == "Penryn"
    assert s.default_cpu_model == "EPYC"
    assert s.default_runtime_class == "myCustomRuntimeClass"


def test_cert_config_defaults() -> None:
    certs = HyperConvergedSpec().cert_config
    assert (certs.ca.duration, certs.ca.renew_before) == ("48h0m0s", "24h0m0s")
    assert (certs.server.duration, certs.server.renew_before) == ("24h0m0s", "12h0m0s")


def test_namespaces_seed_examples() -> None:
    s = spec(
        """
commonTemplatesNamespace: kubevirt
tektonPipelinesNamespace: kubevirt
tektonTasksNamespace: kubevirt
commonBootImageNamespace: custom-namespace-name
"""
    ).spec
    assert s.common_templates_namespace == s.tekton_tasks_namespace == "kubevirt"
    assert s.common_boot_image_namespace == "custom-namespace-name"


def test_workload_update_strategy_defaults_and_empty_list() -> None:
    strategy = HyperConvergedSpec().workload_update_strategy
    assert strategy.workload_update_methods == ["LiveMigrate"]
    assert strategy.batch_eviction_size == 10
    assert strategy.batch_eviction_interval == "1m0s"
    explicit_empty = spec("workloadUpdateStrategy: {workloadUpdateMethods: []}").spec
    assert explicit_empty.workload_update_strategy.workload_update_methods == []
    encoded = msgspec.json.decode(msgspec.json.encode(explicit_empty))
    assert encoded["workloadUpdateStrategy"] == {"workloadUpdateMethods": []}


def test_network_sections_seed_examples() -> None:
    s = spec(
        """
kubeSecondaryDNSNameServerIP: "127.0.0.1"
networkBinding:
  custom-binding2:
    sidecarImage: quay.io/custom-binding2-image
    networkAttachmentDefinition: customBinding2Nad
"""
    ).spec
    assert s.kube_secondary_dns_name_server_ip == "127.0.0.1"
    assert s.network_binding["custom-binding2"].network_attachment_definition == (
        "customBinding2Nad"
    )
    assert HyperConvergedSpec().network_binding == {}
    assert HyperConvergedSpec().kube_secondary_dns_name_server_ip is None


def test_golden_images_seed_example() -> None:
    templates = spec(
        """
dataImportCronTemplates:
- metadata:
    name: fedora-image-cron
    annotations: {dataimportcrontemplate.kubevirt.io/enable: 'false'}
- metadata: {name: custom-image1}
  spec:
    schedule: "0 */12 * * *"
    template: {spec: {source: {registry: {url: docker://myprivateregistry/custom1}}}}
    managedDataSource: custom1
    retentionPolicy: "All"
"""
    ).spec.data_import_cron_templates
    assert [t.metadata.name for t in templates] == ["fedora-image-cron", "custom-image1"]


def test_log_verbosity_seed_example() -> None:
    log = spec(
        """
logVerbosityConfig:
  kubevirt:
    virtLauncher: 8
    virtHandler: 4
    virtController: 1
    nodeVerbosity: {node01: 4, node02: 3}
  cdi: 3
"""
    ).spec.log_verbosity_config
    assert log is not None and log.kubevirt is not None
    assert log.kubevirt.virt_launcher == 8 and log.kubevirt.node_verbosity["node02"] == 3
    assert log.cdi == 3


def test_strategy_and_option_defaults() -> None:
    s = HyperConvergedSpec()
    assert s.uninstall_strategy == "BlockUninstallIfWorkloadsExist"
    assert s.eviction_strategy is None  # LiveMigrate or None depending on worker count
    assert s.virtual_machine_options.disable_free_page_reporting is False
    assert s.virtual_machine_options.disable_serial_console_log is True
    assert s.higher_workload_density.memory_overcommit_percentage == 100
    assert s.tuning_policy is None
    assert s.ksm_configuration is None
    assert s.tls_security_profile is None


def test_eviction_strategy_values() -> None:
    assert spec("evictionStrategy: LiveMigrateIfPossible").spec.eviction_strategy == (
        "LiveMigrateIfPossible"
    )
    with pytest.raises(msgspec.ValidationError, match="evictionStrategy"):
        spec("evictionStrategy: Sometimes")


def test_ksm_nil_versus_empty_selector() -> None:
    everywhere = spec("ksmConfiguration: {nodeLabelSelector: {}}").spec.ksm_configuration
    assert everywhere is not None and everywhere.node_label_selector == LabelSelector()
    nowhere = spec("ksmConfiguration: {}").spec.ksm_configuration
    assert nowhere is not None and nowhere.node_label_selector is None


def test_application_aware_defaults_and_seed_example() -> None:
    assert ApplicationAwareConfig().vmi_calc_config_name == "DedicatedVirtualResources"
    assert ApplicationAwareConfig().allow_application_aware_cluster_resource_quota is False
    aaq = spec(
        """
applicationAwareConfig:
  vmiCalcConfigName: "VmiPodUsage"
  namespaceSelector: {matchLabels: {some-label: "some value"}}
  allowApplicationAwareClusterResourceQuota: true
"""
    ).spec.application_aware_config
    assert aaq is not None and aaq.allow_application_aware_cluster_resource_quota


def test_tuning_policy_and_tls_profile_decode() -> None:
    s = spec(
        """
tuningPolicy: highBurst
tlsSecurityProfile: {type: Old, old: {}}
higherWorkloadDensity: {memoryOvercommitPercentage: 150}
virtualMachineOptions: {disableFreePageReporting: false, disableSerialConsoleLog: true}
"""
    ).spec
    assert s.tuning_policy == "highBurst"
    assert s.tls_security_profile is not None and s.tls_security_profile.type == "Old"
    assert s.higher_workload_density.memory_overcommit_percentage == 150


def test_annotation_names() -> None:
    assert d.TUNING_POLICY_ANNOTATION == "hco.kubevirt.io/tuningPolicy"
    assert d.DEPLOY_OVS_ANNOTATION == "deployOVS"
