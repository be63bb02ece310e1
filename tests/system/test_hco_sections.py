"""Every section of the HyperConverged seed goes through commands and comes back in the read
models: a HyperConverged with all of them set is applied, and each operand the running
controller wrote equals what the pure derivation (tested section by section in tests/hco)
says it must be."""

from __future__ import annotations

from typing import Any

import msgspec
import yaml

from controlplane.hco.desired import desired_operands
from controlplane.hco.operands import ClusterInfo
from controlplane.user.client import Client
from events.api import hco_defaults as d
from events.api.hco import HyperConverged
from tests.system.harness import eventually

EVERY_SECTION = """
apiVersion: hco.kubevirt.io/v1beta1
kind: HyperConverged
metadata:
  name: kubevirt-hyperconverged
  namespace: kubevirt-hyperconverged
spec:
  infra:
    nodePlacement:
      nodeSelector: {node-role.kubernetes.io/infra: ""}
      tolerations: [{key: infra, operator: Exists, effect: NoSchedule}]
  workloads:
    nodePlacement:
      nodeSelector: {node-role.kubernetes.io/worker: ""}
  featureGates:
    downwardMetrics: true
    deployKubeSecondaryDNS: true
    persistentReservation: true
  liveMigrationConfig:
    parallelMigrationsPerCluster: 3
    parallelOutboundMigrationsPerNode: 1
    bandwidthPerMigration: 64Mi
    completionTimeoutPerGiB: 400
    progressTimeout: 100
    network: migration-net
    allowAutoConverge: true
    allowPostCopy: true
  permittedHostDevices:
    pciHostDevices:
      - pciDeviceSelector: "10DE:1EB8"
        resourceName: nvidia.com/TU104GL_Tesla_T4
    mediatedDevices:
      - mdevNameSelector: GRID T4-1Q
        resourceName: nvidia.com/GRID_T4-1Q
    usbHostDevices:
      - resourceName: kubevirt.io/storage
        selectors: [{vendor: "46f4", product: "0001"}]
  mediatedDevicesConfiguration:
    mediatedDeviceTypes: [nvidia-222]
    nodeMediatedDeviceTypes:
      - nodeSelector: {kubernetes.io/hostname: node-2}
        mediatedDeviceTypes: [nvidia-230]
  filesystemOverhead:
    global: "0.07"
    storageClass: {nfs: "0.1"}
  scratchSpaceStorageClass: scratch
  resourceRequirements:
    storageWorkloads:
      limits: {cpu: 500m, memory: 2Gi}
      requests: {cpu: 250m, memory: 1Gi}
    vmiCPUAllocationRatio: 8
  certConfig:
    ca: {duration: 48h0m0s, renewBefore: 24h0m0s}
    server: {duration: 24h0m0s, renewBefore: 12h0m0s}
  obsoleteCPUs:
    cpuModels: [Haswell]
    minCPUModel: Nehalem
  defaultCPUModel: Skylake-Server
  defaultRuntimeClass: kata
  workloadUpdateStrategy:
    workloadUpdateMethods: [LiveMigrate, Evict]
    batchEvictionSize: 5
    batchEvictionInterval: 2m0s
  storageImport:
    insecureRegistries: [registry.local:5000]
  kubeSecondaryDNSNameServerIP: 10.0.0.53
  networkBinding:
    passt:
      sidecarImage: quay.io/kubevirt/network-passt-binding
  dataImportCronTemplates:
    - metadata: {name: my-image}
      spec:
        schedule: "0 */12 * * *"
        managedDataSource: my-image
  commonBootImageNamespace: golden-images
  logVerbosityConfig:
    kubevirt: {virtLauncher: 8, virtHandler: 4}
    cdi: 3
  uninstallStrategy: RemoveWorkloads
  evictionStrategy: LiveMigrateIfPossible
  vmStateStorageClass: vm-state
  virtualMachineOptions:
    disableFreePageReporting: true
  ksmConfiguration:
    nodeLabelSelector: {matchLabels: {ksm: "on"}}
  tlsSecurityProfile:
    type: Custom
    custom:
      ciphers: [ECDHE-ECDSA-AES128-GCM-SHA256]
      minTLSVersion: VersionTLS12
  applicationAwareConfig:
    vmiCalcConfigName: DedicatedVirtualResources
    allowApplicationAwareClusterResourceQuota: true
  higherWorkloadDensity:
    memoryOvercommitPercentage: 150
  tuningPolicy: highBurst
"""

OPERAND_KINDS = ("KubeVirt", "CDI", "NetworkAddonsConfig", "SSP")


async def written(vb: Client, kind: str, want: dict[str, Any]) -> dict[str, Any] | None:
    items = await vb.query(kind)
    return items[0] if items and items[0].get("spec") == want.get("spec") else None


async def test_every_seed_section_reaches_the_operands_through_commands(vb: Client) -> None:
    manifest = yaml.safe_load(EVERY_SECTION)
    [outcome] = await vb.apply(manifest)
    assert outcome.accepted and outcome.sequences
    hco = await vb.get("HyperConverged", d.DEFAULT_NAMESPACE, d.DEFAULT_NAME,
                       after=outcome.sequences[-1])
    sent = msgspec.convert(manifest, HyperConverged).spec
    assert msgspec.convert(hco["spec"], type(sent)) == sent  # the spec as submitted

    desired = desired_operands(msgspec.convert(manifest, HyperConverged),
                               cluster=ClusterInfo(highly_available=True))
    assert not desired.failures
    for kind in OPERAND_KINDS:
        want = desired.objects[kind]
        got = await eventually(lambda k=kind, w=want: written(vb, k, w),
                               what=f"{kind} derived from every section")
        assert got["metadata"]["name"] == want["metadata"]["name"]
    kubevirt = await vb.get("KubeVirt", "", desired.objects["KubeVirt"]["metadata"]["name"])
    config = kubevirt["spec"]["configuration"]
    assert config["migrations"]["bandwidthPerMigration"] == "64Mi"
    assert config["developerConfiguration"]["cpuAllocationRatio"] == 8
    assert config["defaultRuntimeClass"] == "kata"
