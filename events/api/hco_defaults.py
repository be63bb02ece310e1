"""Every HyperConverged default and well-known name, defined once.

Values come from the HCO cluster-configuration seed; where it is silent, from upstream HCO.
The types in `events.api.hco` and the operand derivation both import from here, so a default
never drifts between the API and what the operands receive.
"""

from __future__ import annotations

from typing import Final

API_VERSION: Final = "hco.kubevirt.io/v1beta1"
KIND: Final = "HyperConverged"
DEFAULT_NAME: Final = "kubevirt-hyperconverged"
DEFAULT_NAMESPACE: Final = "kubevirt-hyperconverged"

# The operand CRs HCO writes, one of each, by kind
OPERAND_API_VERSIONS: Final = {
    "KubeVirt": "kubevirt.io/v1",
    "CDI": "cdi.kubevirt.io/v1beta1",
    "NetworkAddonsConfig": "networkaddonsoperator.network.kubevirt.io/v1",
    "SSP": "ssp.kubevirt.io/v1beta2",
}

# featureGates (seed: "Default: ..." under each gate)
DOWNWARD_METRICS: Final = False
ENABLE_COMMON_BOOT_IMAGE_IMPORT: Final = True
DEPLOY_VM_CONSOLE_PROXY: Final = False
DEPLOY_KUBE_SECONDARY_DNS: Final = False
PERSISTENT_RESERVATION: Final = False
AUTO_RESOURCE_LIMITS: Final = False
ALIGN_CPUS: Final = False
ENABLE_APPLICATION_AWARE_QUOTA: Final = False

# liveMigrationConfig (the seed gives 800 for completionTimeoutPerGiB; newer HCO uses 150)
PARALLEL_MIGRATIONS_PER_CLUSTER: Final = 5
PARALLEL_OUTBOUND_MIGRATIONS_PER_NODE: Final = 2
COMPLETION_TIMEOUT_PER_GIB: Final = 800
PROGRESS_TIMEOUT: Final = 150
ALLOW_AUTO_CONVERGE: Final = False
ALLOW_POST_COPY: Final = False

# certConfig
CA_DURATION: Final = "48h0m0s"
CA_RENEW_BEFORE: Final = "24h0m0s"
SERVER_DURATION: Final = "24h0m0s"
SERVER_RENEW_BEFORE: Final = "12h0m0s"
MIN_CERT_DURATION: Final = "10m"

# resourceRequirements
VMI_CPU_ALLOCATION_RATIO: Final = 10

# workloadUpdateStrategy
WORKLOAD_UPDATE_METHODS: Final = ("LiveMigrate",)
BATCH_EVICTION_SIZE: Final = 10
BATCH_EVICTION_INTERVAL: Final = "1m0s"

# obsoleteCPUs: the hard-coded list is always obsolete; KubeVirt's minCPUModel when unset
HARDCODED_OBSOLETE_CPU_MODELS: Final = (
    "486",
    "pentium",
    "pentium2",
    "pentium3",
    "pentiumpro",
    "coreduo",
    "n270",
    "core2duo",
    "Conroe",
    "athlon",
    "phenom",
    "qemu64",
    "qemu32",
    "kvm64",
    "kvm32",
)
KUBEVIRT_MIN_CPU_MODEL: Final = "Penryn"

UNINSTALL_STRATEGY: Final = "BlockUninstallIfWorkloadsExist"
# evictionStrategy is unset in the spec: LiveMigrate with several workers, None with one
EVICTION_STRATEGY_MULTI_WORKER: Final = "LiveMigrate"
EVICTION_STRATEGY_SINGLE_WORKER: Final = "None"

# virtualMachineOptions (seed: serial console logging is disabled by default)
DISABLE_FREE_PAGE_REPORTING: Final = False
DISABLE_SERIAL_CONSOLE_LOG: Final = True

# applicationAwareConfig
VMI_CALC_CONFIG_NAME: Final = "DedicatedVirtualResources"
ALLOW_APPLICATION_AWARE_CLUSTER_RESOURCE_QUOTA: Final = False

# higherWorkloadDensity
MEMORY_OVERCOMMIT_PERCENTAGE: Final = 100
MIN_MEMORY_OVERCOMMIT_PERCENTAGE: Final = 10

# tlsSecurityProfile: unset means Intermediate on plain Kubernetes
TLS_SECURITY_PROFILE_TYPE: Final = "Intermediate"

# SSP defaults (upstream HCO)
COMMON_TEMPLATES_NAMESPACE: Final = "openshift"
TEMPLATE_VALIDATOR_REPLICAS: Final = 2

# Annotations on the HyperConverged object
TUNING_POLICY_ANNOTATION: Final = "hco.kubevirt.io/tuningPolicy"
DEPLOY_OVS_ANNOTATION: Final = "deployOVS"
KUBEVIRT_JSONPATCH_ANNOTATION: Final = "kubevirt.kubevirt.io/jsonpatch"
CDI_JSONPATCH_ANNOTATION: Final = "containerizeddataimporter.kubevirt.io/jsonpatch"
CNAO_JSONPATCH_ANNOTATION: Final = "networkaddonsconfigs.kubevirt.io/jsonpatch"
SSP_JSONPATCH_ANNOTATION: Final = "ssp.kubevirt.io/jsonpatch"
DATA_IMPORT_CRON_ENABLE_ANNOTATION: Final = "dataimportcrontemplate.kubevirt.io/enable"

# tuningPolicy highBurst: the rate limits HCO hides behind the profile
HIGH_BURST_QPS: Final = 200
HIGH_BURST_BURST: Final = 400
