"""Admission rules: each refusal names the field and the rule."""

from __future__ import annotations

import pytest

from controlplane.hco.validation import check_uninstall, validate_hco
from events.api.errors import InvalidSpec
from events.api.hco import HyperConverged, HyperConvergedSpec
from tests.hco.manifests import load, spec


def refuse(
    hco: HyperConverged,
    field: str,
    rule: str,
    *,
    vms_exist: bool = False,
    previous: HyperConvergedSpec | None = None,
) -> None:
    with pytest.raises(InvalidSpec) as info:
        validate_hco(hco, vms_exist=vms_exist, previous=previous)
    assert info.value.field == field
    assert rule in info.value.rule


def test_defaults_are_valid() -> None:
    validate_hco(HyperConverged(), vms_exist=True, previous=HyperConverged().spec)


def test_seed_cert_example_is_valid() -> None:
    hco = spec(
        """
certConfig:
  ca: {duration: 48h0m0s, renewBefore: 24h0m0s}
  server: {duration: 24h0m0s, renewBefore: 12h0m0s}
"""
    )
    validate_hco(hco, vms_exist=False, previous=None)


@pytest.mark.parametrize(
    ("yaml_text", "field", "rule"),
    [
        ("certConfig: {ca: {duration: 9m}}", "spec.certConfig.ca.duration", "at least 10m"),
        (
            "certConfig: {server: {renewBefore: 5m}}",
            "spec.certConfig.server.renewBefore",
            "at least 10m",
        ),
        ("certConfig: {ca: {duration: 2 days}}", "spec.certConfig.ca.duration", "Go duration"),
        (
            "certConfig: {ca: {duration: 1h, renewBefore: 30m}, server: {duration: 2h}}",
            "spec.certConfig.server.duration",
            "less than ca.duration",
        ),
        (
            "certConfig: {ca: {duration: 1h, renewBefore: 1h}}",
            "spec.certConfig.ca.renewBefore",
            "less than ca.duration",
        ),
        (
            "certConfig: {server: {duration: 12h, renewBefore: 13h}}",
            "spec.certConfig.server.renewBefore",
            "less than server.duration",
        ),
    ],
)
def test_cert_rules(yaml_text: str, field: str, rule: str) -> None:
    refuse(spec(yaml_text), field, rule)


def test_auto_cpu_limit_is_incompatible_with_ratio_one() -> None:
    hco = spec(
        """
resourceRequirements:
  vmiCPUAllocationRatio: 1
  autoCPULimitNamespaceLabelSelector: {matchLabels: {autocpulimit: "true"}}
"""
    )
    refuse(
        hco,
        "spec.resourceRequirements.autoCPULimitNamespaceLabelSelector",
        "vmiCPUAllocationRatio 1",
    )
    ok = spec("resourceRequirements: {autoCPULimitNamespaceLabelSelector: {matchLabels: {a: b}}}")
    validate_hco(ok, vms_exist=False, previous=None)


def test_allocation_ratio_and_overcommit_bounds() -> None:
    refuse(
        spec("resourceRequirements: {vmiCPUAllocationRatio: 0}"),
        "spec.resourceRequirements.vmiCPUAllocationRatio",
        "greater than 0",
    )
    refuse(
        spec("higherWorkloadDensity: {memoryOvercommitPercentage: 5}"),
        "spec.higherWorkloadDensity.memoryOvercommitPercentage",
        "at least 10",
    )


def test_tuning_policy_annotation_required() -> None:
    refuse(spec("tuningPolicy: annotation"), "spec.tuningPolicy", "hco.kubevirt.io/tuningPolicy")


@pytest.mark.parametrize(
    ("annotation", "rule"),
    [
        ("not json", "JSON object"),
        ("[1]", "JSON object"),
        ('{"qps": 100}', "burst"),
        ('{"qps": 0, "burst": 200}', "qps"),
        ('{"qps": 100, "burst": 1.5}', "burst"),
    ],
)
def test_tuning_policy_malformed_annotation(annotation: str, rule: str) -> None:
    hco = HyperConverged(
        metadata=load("metadata: {annotations: {}}").metadata,
    )
    hco.metadata.annotations["hco.kubevirt.io/tuningPolicy"] = annotation
    hco.spec.tuning_policy = "annotation"
    refuse(hco, "metadata.annotations[hco.kubevirt.io/tuningPolicy]", rule)


def test_tuning_policy_seed_example_is_valid_and_unset_policy_ignores_annotation() -> None:
    hco = load(
        """
metadata:
  name: kubevirt-hyperconverged
  annotations: {hco.kubevirt.io/tuningPolicy: '{"qps":100,"burst":200}'}
spec: {tuningPolicy: annotation}
"""
    )
    validate_hco(hco, vms_exist=False, previous=None)
    hco.metadata.annotations["hco.kubevirt.io/tuningPolicy"] = "garbage"
    hco.spec.tuning_policy = None
    validate_hco(hco, vms_exist=False, previous=None)


def test_high_burst_with_annotation_is_refused() -> None:
    hco = load(
        """
metadata: {annotations: {hco.kubevirt.io/tuningPolicy: '{"qps":1,"burst":2}'}}
spec: {tuningPolicy: highBurst}
"""
    )
    refuse(hco, "spec.tuningPolicy", "highBurst cannot be combined")


def test_workloads_placement_frozen_while_vms_exist() -> None:
    before = spec("workloads: {nodePlacement: {nodeSelector: {a: b}}}").spec
    after = spec("workloads: {nodePlacement: {nodeSelector: {a: c}}}")
    refuse(
        after,
        "spec.workloads.nodePlacement",
        "cannot change while virtual machines exist",
        vms_exist=True,
        previous=before,
    )
    validate_hco(after, vms_exist=False, previous=before)
    infra_change = spec(
        "workloads: {nodePlacement: {nodeSelector: {a: b}}}\n"
        "infra: {nodePlacement: {nodeSelector: {x: y}}}"
    )
    validate_hco(infra_change, vms_exist=True, previous=before)


def test_misc_field_rules() -> None:
    refuse(
        spec("kubeSecondaryDNSNameServerIP: not-an-ip"),
        "spec.kubeSecondaryDNSNameServerIP",
        "IPv4",
    )
    refuse(
        spec("liveMigrationConfig: {bandwidthPerMigration: fast}"),
        "spec.liveMigrationConfig.bandwidthPerMigration",
        "quantity",
    )
    refuse(
        spec("workloadUpdateStrategy: {batchEvictionInterval: soon}"),
        "spec.workloadUpdateStrategy.batchEvictionInterval",
        "Go duration",
    )
    refuse(
        spec("mediatedDevicesConfiguration: {mediatedDeviceTypes: []}"),
        "spec.mediatedDevicesConfiguration.mediatedDeviceTypes",
        "must not be empty",
    )
    refuse(
        spec("tlsSecurityProfile: {type: Custom}"),
        "spec.tlsSecurityProfile.custom",
        "required when type is Custom",
    )
    validate_hco(
        spec("liveMigrationConfig: {bandwidthPerMigration: 2048Mi}"),
        vms_exist=False,
        previous=None,
    )


def test_malformed_jsonpatch_annotation_is_refused() -> None:
    hco = load(
        """
metadata:
  annotations:
    containerizeddataimporter.kubevirt.io/jsonpatch: '[{"op": "add", "path": "/status/x"}]'
"""
    )
    refuse(
        hco,
        "metadata.annotations[containerizeddataimporter.kubevirt.io/jsonpatch]",
        "outside /spec",
    )


def test_jsonpatch_that_does_not_apply_is_admitted_for_the_controller_to_report() -> None:
    hco = load(
        """
metadata:
  annotations:
    containerizeddataimporter.kubevirt.io/jsonpatch: '[{"op": "remove", "path": "/spec/nope"}]'
"""
    )
    validate_hco(hco, vms_exist=False, previous=None)


def test_uninstall_blocked_while_vms_exist() -> None:
    with pytest.raises(InvalidSpec) as info:
        check_uninstall(HyperConverged(), vms_exist=True)
    assert info.value.field == "spec.uninstallStrategy"
    assert "delete the virtual machines first" in info.value.rule
    assert check_uninstall(HyperConverged(), vms_exist=False) == "proceed"


def test_remove_workloads_deletes_them() -> None:
    hco = spec("uninstallStrategy: RemoveWorkloads")
    assert check_uninstall(hco, vms_exist=True) == "remove-workloads"
