"""CDI, CNAO and SSP derivation, and the registry every operand joins."""

from __future__ import annotations

from typing import Any

import msgspec

from controlplane.hco.operands import OPERANDS, ClusterInfo
from controlplane.hco.operands.cdi import CDI
from controlplane.hco.operands.cna import CNA
from controlplane.hco.operands.ssp import SSP
from events.api.hco import DataImportCronTemplate, HyperConverged
from tests.hco.manifests import load, spec


def test_registry_declares_the_four_jsonpatch_annotations() -> None:
    assert {op.kind: op.jsonpatch_annotation for op in OPERANDS} == {
        "KubeVirt": "kubevirt.kubevirt.io/jsonpatch",
        "CDI": "containerizeddataimporter.kubevirt.io/jsonpatch",
        "NetworkAddonsConfig": "networkaddonsconfigs.kubevirt.io/jsonpatch",
        "SSP": "ssp.kubevirt.io/jsonpatch",
    }


def test_cdi_defaults() -> None:
    cdi = CDI.derive(HyperConverged(), ClusterInfo())
    assert cdi["metadata"]["name"] == "cdi-kubevirt-hyperconverged"
    assert "namespace" not in cdi["metadata"]
    assert cdi["spec"]["uninstallStrategy"] == "BlockUninstallIfWorkloadsExist"
    assert cdi["spec"]["config"] == {
        "featureGates": ["HonorWaitForFirstConsumer"],
        "tlsSecurityProfile": {"type": "Intermediate", "intermediate": {}},
    }
    assert cdi["spec"]["certConfig"]["ca"] == {"duration": "48h0m0s", "renewBefore": "24h0m0s"}


def test_cdi_storage_fields() -> None:
    hco = spec(
        """
filesystemOverhead: {global: "0.1", storageClass: {nfs: "0"}}
scratchSpaceStorageClass: aStorageClassName
resourceRequirements: {storageWorkloads: {limits: {cpu: 500m}, requests: {cpu: 250m}}}
storageImport: {insecureRegistries: ["private-registry-example-1:5000"]}
logVerbosityConfig: {cdi: 3}
infra: {nodePlacement: {nodeSelector: {nodeType: infra}}}
workloads: {nodePlacement: {nodeSelector: {nodeType: nested-virtualization}}}
"""
    )
    cdi_spec = CDI.derive(hco, ClusterInfo())["spec"]
    config = cdi_spec["config"]
    assert config["filesystemOverhead"] == {"global": "0.1", "storageClass": {"nfs": "0"}}
    assert config["scratchSpaceStorageClass"] == "aStorageClassName"
    assert config["podResourceRequirements"] == {
        "limits": {"cpu": "500m"},
        "requests": {"cpu": "250m"},
    }
    assert config["insecureRegistries"] == ["private-registry-example-1:5000"]
    assert config["logVerbosity"] == 3
    assert cdi_spec["infra"] == {"nodeSelector": {"nodeType": "infra"}}
    assert cdi_spec["workloads"] == {"nodeSelector": {"nodeType": "nested-virtualization"}}


def test_cna_defaults_and_self_sign_intervals() -> None:
    cna = CNA.derive(spec("certConfig: {ca: {duration: 72h}}"), ClusterInfo())
    assert cna["metadata"]["name"] == "cluster"
    cna_spec = cna["spec"]
    assert {k: cna_spec[k] for k in ("multus", "linuxBridge", "kubeMacPool")} == {
        "multus": {},
        "linuxBridge": {},
        "kubeMacPool": {},
    }
    assert "ovs" not in cna_spec and "kubeSecondaryDNS" not in cna_spec
    assert cna_spec["selfSignConfiguration"] == {
        "caRotateInterval": "72h0m0s",
        "caOverlapInterval": "24h0m0s",
        "certRotateInterval": "24h0m0s",
        "certOverlapInterval": "12h0m0s",
    }


def test_cna_ovs_annotation_and_secondary_dns() -> None:
    hco = load(
        """
metadata: {annotations: {deployOVS: "true"}}
spec:
  featureGates: {deployKubeSecondaryDNS: true}
  kubeSecondaryDNSNameServerIP: "127.0.0.1"
  workloads: {nodePlacement: {nodeSelector: {a: b}}}
"""
    )
    cna_spec = CNA.derive(hco, ClusterInfo(base_domain="example.com"))["spec"]
    assert cna_spec["ovs"] == {}
    assert cna_spec["kubeSecondaryDNS"] == {"domain": "example.com", "nameServerIP": "127.0.0.1"}
    assert cna_spec["placementConfiguration"] == {"workloads": {"nodeSelector": {"a": "b"}}}
    not_true = load('metadata: {annotations: {deployOVS: "false"}}')
    assert "ovs" not in CNA.derive(not_true, ClusterInfo())["spec"]


def test_ssp_defaults_and_console_proxy() -> None:
    ssp = SSP.derive(HyperConverged(), ClusterInfo())
    assert ssp["metadata"]["name"] == "ssp-kubevirt-hyperconverged"
    assert ssp["spec"]["commonTemplates"] == {"namespace": "openshift"}
    assert ssp["spec"]["templateValidator"] == {"replicas": 2}
    assert "tokenGenerationService" not in ssp["spec"]
    proxied = spec(
        "featureGates: {deployVmConsoleProxy: true}\ncommonTemplatesNamespace: kubevirt\n"
        "infra: {nodePlacement: {nodeSelector: {nodeType: infra}}}"
    )
    ssp_spec = SSP.derive(proxied, ClusterInfo())["spec"]
    assert ssp_spec["tokenGenerationService"] == {"enabled": True}
    assert ssp_spec["commonTemplates"]["namespace"] == "kubevirt"
    assert ssp_spec["templateValidator"]["placement"] == {"nodeSelector": {"nodeType": "infra"}}


def _common(name: str) -> DataImportCronTemplate:
    return msgspec.convert(
        {
            "metadata": {"name": name},
            "spec": {"schedule": "0 */12 * * *", "managedDataSource": name},
        },
        DataImportCronTemplate,
    )


COMMON = ClusterInfo(common_boot_images=(_common("fedora-image-cron"), _common("centos8")))


def golden(hco: HyperConverged, cluster: ClusterInfo = COMMON) -> list[dict[str, Any]]:
    images: list[dict[str, Any]] = SSP.derive(hco, cluster)["spec"]["commonTemplates"].get(
        "dataImportCronTemplates", []
    )
    return images


def test_golden_images_common_disabled_modified_and_custom() -> None:
    hco = spec(
        """
commonBootImageNamespace: custom-namespace-name
dataImportCronTemplates:
- metadata:
    name: fedora-image-cron
    annotations: {dataimportcrontemplate.kubevirt.io/enable: 'false'}
- metadata: {name: centos8}
  spec: {managedDataSource: centos-stream8, template: {spec: {storage: {}}}}
- metadata: {name: custom-image1}
  spec: {schedule: "0 */12 * * *", managedDataSource: custom1}
"""
    )
    images = golden(hco)
    assert [i["metadata"]["name"] for i in images] == ["centos8", "custom-image1"]
    modified = images[0]
    assert modified["spec"]["schedule"] == "0 */12 * * *"  # copied from the common image
    assert modified["spec"]["managedDataSource"] == "centos-stream8"
    assert "namespace" not in modified["metadata"]  # namespace ignored for modified ones
    untouched = golden(spec("commonBootImageNamespace: hidden"))
    assert [i["metadata"] for i in untouched] == [
        {"name": "fedora-image-cron", "namespace": "hidden"},
        {"name": "centos8", "namespace": "hidden"},
    ]


def test_golden_images_gate_off_keeps_only_custom() -> None:
    hco = spec(
        """
featureGates: {enableCommonBootImageImport: false}
dataImportCronTemplates:
- metadata: {name: custom-image2}
  spec: {schedule: "1 */12 * * *", managedDataSource: custom2, retentionPolicy: "None"}
"""
    )
    assert [i["metadata"]["name"] for i in golden(hco)] == ["custom-image2"]
