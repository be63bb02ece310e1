"""The KubeVirt CR derived from the HyperConverged carries every mapped field."""

from __future__ import annotations

from typing import Any

from controlplane.hco.operands import ClusterInfo
from controlplane.hco.operands.kubevirt import KUBEVIRT, MANDATORY_FEATURE_GATES
from events.api.hco import HyperConverged
from tests.hco.manifests import load, spec


def kubevirt(hco: HyperConverged, cluster: ClusterInfo | None = None) -> dict[str, Any]:
    return KUBEVIRT.derive(hco, cluster or ClusterInfo())


def configuration(hco: HyperConverged) -> dict[str, Any]:
    config: dict[str, Any] = kubevirt(hco)["spec"]["configuration"]
    return config


def test_identity() -> None:
    kv = kubevirt(HyperConverged())
    assert kv["apiVersion"] == "kubevirt.io/v1"
    assert kv["kind"] == "KubeVirt"
    assert kv["metadata"]["name"] == "kubevirt-kubevirt-hyperconverged"
    assert kv["metadata"]["namespace"] == "kubevirt-hyperconverged"
    assert KUBEVIRT.jsonpatch_annotation == "kubevirt.kubevirt.io/jsonpatch"


def test_default_migrations_eviction_and_update_strategy() -> None:
    kv = kubevirt(HyperConverged())
    config = kv["spec"]["configuration"]
    assert config["migrations"] == {
        "parallelMigrationsPerCluster": 5,
        "parallelOutboundMigrationsPerNode": 2,
        "completionTimeoutPerGiB": 800,
        "progressTimeout": 150,
        "allowAutoConverge": False,
        "allowPostCopy": False,
    }
    assert config["evictionStrategy"] == "LiveMigrate"
    assert kv["spec"]["workloadUpdateStrategy"] == {
        "workloadUpdateMethods": ["LiveMigrate"],
        "batchEvictionSize": 10,
        "batchEvictionInterval": "1m0s",
    }
    assert kv["spec"]["uninstallStrategy"] == "BlockUninstallIfWorkloadsExist"


def test_single_worker_cluster_defaults() -> None:
    kv = kubevirt(HyperConverged(), ClusterInfo(highly_available=False))
    assert kv["spec"]["configuration"]["evictionStrategy"] == "None"
    assert kv["spec"]["infra"] == {"replicas": 1}
    assert "workloads" not in kv["spec"]


def test_live_migration_config_is_copied() -> None:
    hco = spec(
        """
liveMigrationConfig:
  bandwidthPerMigration: 2048Mi
  network: migration-network
  allowPostCopy: true
  completionTimeoutPerGiB: 100
evictionStrategy: LiveMigrateIfPossible
"""
    )
    config = configuration(hco)
    assert config["migrations"]["bandwidthPerMigration"] == "2048Mi"
    assert config["migrations"]["network"] == "migration-network"
    assert config["migrations"]["allowPostCopy"] is True
    assert config["migrations"]["completionTimeoutPerGiB"] == 100
    assert config["evictionStrategy"] == "LiveMigrateIfPossible"


def test_cpu_models() -> None:
    hco = spec(
        """
defaultCPUModel: EPYC
obsoleteCPUs: {cpuModels: [Opteron_G1, "486"], minCPUModel: Penryn}
"""
    )
    config = configuration(hco)
    assert config["cpuModel"] == "EPYC"
    assert config["minCPUModel"] == "Penryn"
    assert config["obsoleteCPUModels"]["Opteron_G1"] is True
    assert config["obsoleteCPUModels"]["kvm32"] is True
    assert len(config["obsoleteCPUModels"]) == 16
    defaults = configuration(HyperConverged())
    assert "cpuModel" not in defaults and "minCPUModel" not in defaults


def test_feature_gates_mapping() -> None:
    hco = spec(
        """
featureGates:
  downwardMetrics: true
  persistentReservation: true
  autoResourceLimits: true
  alignCPUs: true
  deployKubeSecondaryDNS: true
"""
    )
    kv = kubevirt(hco)
    gates = kv["spec"]["configuration"]["developerConfiguration"]["featureGates"]
    assert gates[: len(MANDATORY_FEATURE_GATES)] == list(MANDATORY_FEATURE_GATES)
    assert gates[len(MANDATORY_FEATURE_GATES) :] == [
        "DownwardMetrics",
        "PersistentReservation",
        "AutoResourceLimitsGate",
        "AlignCPUs",
    ]
    assert kv["metadata"]["annotations"] == {
        "alpha.kubevirt.io/EmulatorThreadCompleteToEvenParity": ""
    }
    default_gates = configuration(HyperConverged())["developerConfiguration"]["featureGates"]
    assert default_gates == list(MANDATORY_FEATURE_GATES)


def test_developer_configuration_ratios_and_verbosity() -> None:
    hco = spec(
        """
resourceRequirements: {vmiCPUAllocationRatio: 16}
higherWorkloadDensity: {memoryOvercommitPercentage: 150}
logVerbosityConfig: {kubevirt: {virtLauncher: 8, nodeVerbosity: {node01: 4}}}
"""
    )
    dev = configuration(hco)["developerConfiguration"]
    assert dev["cpuAllocationRatio"] == 16
    assert dev["memoryOvercommit"] == 150
    assert dev["logVerbosity"] == {"virtLauncher": 8, "nodeVerbosity": {"node01": 4}}
    defaults = configuration(HyperConverged())["developerConfiguration"]
    assert (defaults["cpuAllocationRatio"], defaults["memoryOvercommit"]) == (10, 100)


def test_permitted_host_devices_replace_and_drop_disabled() -> None:
    hco = spec(
        """
permittedHostDevices:
  pciHostDevices:
  - {pciDeviceSelector: "10DE:1DB6", resourceName: "nvidia.com/GV100GL_Tesla_V100"}
  - {pciDeviceSelector: "10DE:1EB8", resourceName: "nvidia.com/T4", disabled: true}
  mediatedDevices:
  - {mdevNameSelector: "GRID T4-1Q", resourceName: "nvidia.com/GRID_T4-1Q"}
  usbHostDevices:
  - resourceName: kubevirt.io/storage
    selectors: [{vendor: "46f4", product: "0001"}]
"""
    )
    devices = configuration(hco)["permittedHostDevices"]
    assert devices["pciHostDevices"] == [
        {
            "pciVendorSelector": "10DE:1DB6",
            "resourceName": "nvidia.com/GV100GL_Tesla_V100",
            "externalResourceProvider": False,
        }
    ]
    assert devices["mediatedDevices"][0]["mdevNameSelector"] == "GRID T4-1Q"
    assert devices["usbHostDevices"][0]["selectors"] == [{"vendor": "46f4", "product": "0001"}]


def test_mediated_devices_configuration() -> None:
    hco = spec(
        """
mediatedDevicesConfiguration:
  mediatedDeviceTypes: [nvidia-222]
  nodeMediatedDeviceTypes:
  - {nodeSelector: {kubernetes.io/hostname: nodeName}, mediatedDeviceTypes: [nvidia-228]}
"""
    )
    assert configuration(hco)["mediatedDevicesConfiguration"] == {
        "mediatedDeviceTypes": ["nvidia-222"],
        "nodeMediatedDeviceTypes": [
            {
                "nodeSelector": {"kubernetes.io/hostname": "nodeName"},
                "mediatedDeviceTypes": ["nvidia-228"],
            }
        ],
    }


def test_storage_classes_runtime_class_ksm_and_auto_cpu_limit() -> None:
    hco = spec(
        """
defaultRuntimeClass: myCustomRuntimeClass
vmStateStorageClass: rook-cephfs
ksmConfiguration: {nodeLabelSelector: {}}
resourceRequirements: {autoCPULimitNamespaceLabelSelector: {matchLabels: {autocpulimit: "true"}}}
"""
    )
    config = configuration(hco)
    assert config["defaultRuntimeClass"] == "myCustomRuntimeClass"
    assert config["vmStateStorageClass"] == "rook-cephfs"
    assert config["ksmConfiguration"] == {"nodeLabelSelector": {}}
    assert config["autoCPULimitNamespaceLabelSelector"] == {
        "matchLabels": {"autocpulimit": "true"}
    }
    assert "ksmConfiguration" not in configuration(HyperConverged())


def test_tls_configuration() -> None:
    default = configuration(HyperConverged())["tlsConfiguration"]
    assert default["minTLSVersion"] == "VersionTLS12"
    assert "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" in default["ciphers"]
    old = configuration(spec("tlsSecurityProfile: {type: Old, old: {}}"))["tlsConfiguration"]
    assert old["minTLSVersion"] == "VersionTLS10"
    assert old["ciphers"][-1] == "TLS_RSA_WITH_3DES_EDE_CBC_SHA"
    assert len(old["ciphers"]) == 18
    custom = configuration(
        spec(
            """
tlsSecurityProfile:
  type: Custom
  custom: {ciphers: [ECDHE-RSA-AES128-GCM-SHA256], minTLSVersion: VersionTLS13}
"""
        )
    )["tlsConfiguration"]
    assert custom == {
        "minTLSVersion": "VersionTLS13",
        "ciphers": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
    }


def test_tuning_policy_high_burst_and_annotation() -> None:
    limiter = {
        "restClient": {"rateLimiter": {"tokenBucketRateLimiter": {"qps": 200, "burst": 400}}}
    }
    config = configuration(spec("tuningPolicy: highBurst"))
    for component in ("api", "controller", "handler", "webhook"):
        assert config[f"{component}Configuration"] == limiter
    annotated = load(
        """
metadata: {annotations: {hco.kubevirt.io/tuningPolicy: '{"qps":100,"burst":200}'}}
spec: {tuningPolicy: annotation}
"""
    )
    bucket = configuration(annotated)["handlerConfiguration"]["restClient"]["rateLimiter"]
    assert bucket["tokenBucketRateLimiter"] == {"qps": 100, "burst": 200}
    assert "apiConfiguration" not in configuration(HyperConverged())


def test_virtual_machine_options() -> None:
    assert configuration(HyperConverged())["virtualMachineOptions"] == {
        "disableSerialConsoleLog": {}
    }
    both = configuration(
        spec(
            "virtualMachineOptions:\n"
            "  {disableFreePageReporting: true, disableSerialConsoleLog: true}"
        )
    )
    assert both["virtualMachineOptions"] == {
        "disableFreePageReporting": {},
        "disableSerialConsoleLog": {},
    }
    neither = configuration(spec("virtualMachineOptions: {disableSerialConsoleLog: false}"))
    assert "virtualMachineOptions" not in neither


def test_network_binding() -> None:
    hco = spec("networkBinding: {custom-binding1: {sidecarImage: quay.io/custom-binding1-image}}")
    assert configuration(hco)["network"] == {
        "defaultNetworkInterface": "masquerade",
        "binding": {"custom-binding1": {"sidecarImage": "quay.io/custom-binding1-image"}},
    }


def test_cert_config_becomes_certificate_rotate_strategy() -> None:
    hco = spec("certConfig: {server: {duration: 12h0m0s, renewBefore: 6h0m0s}}")
    assert kubevirt(hco)["spec"]["certificateRotateStrategy"] == {
        "selfSigned": {
            "ca": {"duration": "48h0m0s", "renewBefore": "24h0m0s"},
            "server": {"duration": "12h0m0s", "renewBefore": "6h0m0s"},
        }
    }


def test_placement_and_uninstall_strategy() -> None:
    hco = spec(
        """
uninstallStrategy: RemoveWorkloads
infra: {nodePlacement: {nodeSelector: {nodeType: infra}}}
workloads:
  nodePlacement:
    tolerations: [{key: "key", operator: "Equal", value: "kubevirt", effect: "NoSchedule"}]
"""
    )
    kv_spec = kubevirt(hco)["spec"]
    assert kv_spec["uninstallStrategy"] == "RemoveWorkloads"
    assert kv_spec["infra"] == {"nodePlacement": {"nodeSelector": {"nodeType": "infra"}}}
    assert kv_spec["workloads"]["nodePlacement"]["tolerations"] == [
        {"key": "key", "operator": "Equal", "value": "kubevirt", "effect": "NoSchedule"}
    ]


def test_workload_update_methods_empty_means_none() -> None:
    hco = spec("workloadUpdateStrategy: {workloadUpdateMethods: []}")
    assert "workloadUpdateMethods" not in kubevirt(hco)["spec"]["workloadUpdateStrategy"]
