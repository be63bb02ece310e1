"""jsonpatch annotations (apply, fail, taint) and drift detection on derived operands."""

from __future__ import annotations

import copy

from controlplane.hco import jsonpatch
from controlplane.hco.conditions import compute_conditions
from controlplane.hco.desired import desired_operands, drift, pending_write
from events.api.hco import HyperConverged
from tests.hco.manifests import load


def annotated(**annotations: str) -> HyperConverged:
    hco = HyperConverged()
    hco.metadata.annotations.update(annotations)
    return hco


KV = "kubevirt.kubevirt.io/jsonpatch"
CDI = "containerizeddataimporter.kubevirt.io/jsonpatch"
CNAO = "networkaddonsconfigs.kubevirt.io/jsonpatch"


def test_no_annotation_means_derived_objects_and_no_taint() -> None:
    desired = desired_operands(HyperConverged())
    assert set(desired.objects) == {"KubeVirt", "CDI", "NetworkAddonsConfig", "SSP"}
    assert desired.failures == ()
    assert jsonpatch.present(HyperConverged().metadata.annotations) == ()


def test_seed_post_copy_example_applies() -> None:
    hco = load(
        """
metadata:
  annotations:
    kubevirt.kubevirt.io/jsonpatch: |-
      [
        {
          "op": "add",
          "path": "/spec/configuration/migrations",
          "value": {"allowPostCopy": true}
        }
      ]
"""
    )
    desired = desired_operands(hco)
    assert desired.failures == ()
    assert desired.objects["KubeVirt"]["spec"]["configuration"]["migrations"] == {
        "allowPostCopy": True
    }


def test_seed_feature_gate_and_cdi_and_cnao_examples_apply() -> None:
    hco = annotated(
        **{
            KV: '[{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-",'
            '"value":"CPUManager"}]',
            CDI: '[{"op": "add", "path": "/spec/config/uploadProxyURLOverride",'
            ' "value": "myproxy.example.com"}]',
            CNAO: '[{"op": "replace","path": "/spec/kubeMacPool","value": null}]',
        }
    )
    desired = desired_operands(hco)
    assert desired.failures == ()
    gates = desired.objects["KubeVirt"]["spec"]["configuration"]["developerConfiguration"]
    assert gates["featureGates"][-1] == "CPUManager"
    assert desired.objects["CDI"]["spec"]["config"]["uploadProxyURLOverride"] == (
        "myproxy.example.com"
    )
    assert desired.objects["NetworkAddonsConfig"]["spec"]["kubeMacPool"] is None


def test_unparsable_patch_is_reported_and_changes_nothing() -> None:
    clean = desired_operands(HyperConverged()).objects["KubeVirt"]
    desired = desired_operands(annotated(**{KV: "[{not json"}))
    assert desired.objects["KubeVirt"] == clean
    (failure,) = desired.failures
    assert failure.annotation == KV
    assert "not valid JSON" in failure.reason


def test_patch_that_does_not_apply_is_reported_and_changes_nothing() -> None:
    clean = desired_operands(HyperConverged()).objects["CDI"]
    patch = (
        '[{"op": "add", "path": "/spec/config/a", "value": 1},'
        ' {"op": "remove", "path": "/spec/missing"}]'
    )
    desired = desired_operands(annotated(**{CDI: patch}))
    assert desired.objects["CDI"] == clean
    assert desired.failures[0].annotation == CDI
    assert "does not apply" in desired.failures[0].reason


def test_patch_outside_spec_or_not_a_list_is_refused() -> None:
    outside = jsonpatch.apply({}, KV, '[{"op": "add", "path": "/metadata/name", "value": "x"}]')
    assert isinstance(outside, jsonpatch.PatchFailure)
    assert "outside /spec" in outside.reason
    not_list = jsonpatch.apply({}, KV, '{"op": "add"}')
    assert isinstance(not_list, jsonpatch.PatchFailure)
    assert "JSON array" in not_list.reason


def test_tainted_while_any_annotation_present() -> None:
    hco = annotated(**{CNAO: "[]", "unrelated": "x"})
    assert jsonpatch.present(hco.metadata.annotations) == (CNAO,)
    conditions = compute_conditions(operands={}, tainted=True)
    tainted = [c for c in conditions if c.type == "TaintedConfiguration"]
    assert len(tainted) == 1
    assert tainted[0].status == "True"
    assert tainted[0].reason == "UnsupportedFeatureAnnotation"
    assert tainted[0].message == "Unsupported feature was activated via an HCO annotation"
    untainted = compute_conditions(operands={}, tainted=False)
    assert all(c.type != "TaintedConfiguration" for c in untainted)


def test_unsafe_modification_counts_operations() -> None:
    hco = annotated(
        **{
            KV: '[{"op": "add", "path": "/spec/a", "value": 1},'
            ' {"op": "add", "path": "/spec/b", "value": 2}]',
            CDI: "broken",
        }
    )
    assert jsonpatch.unsafe_modification_counts(hco.metadata.annotations) == {KV: 2, CDI: 0}


def test_drift_none_for_identical_and_ignores_status_and_foreign_labels() -> None:
    desired = desired_operands(HyperConverged()).objects["KubeVirt"]
    actual = copy.deepcopy(desired)
    actual["status"] = {"phase": "Deployed"}
    actual["metadata"]["labels"]["someone-else"] = "x"
    actual["metadata"]["resourceVersion"] = "42"
    assert drift(desired, actual) == []


def test_drift_lists_changed_added_and_removed_paths() -> None:
    desired = desired_operands(HyperConverged()).objects["KubeVirt"]
    actual = copy.deepcopy(desired)
    config = actual["spec"]["configuration"]
    config["migrations"]["parallelMigrationsPerCluster"] = 50
    config["developerConfiguration"]["featureGates"].append("Extra")
    del config["evictionStrategy"]
    config["obsoleteCPUModels"]["a/b"] = True
    actual["metadata"]["labels"]["app.kubernetes.io/component"] = "other"
    assert drift(desired, actual) == [
        "/spec/configuration/developerConfiguration/featureGates",
        "/spec/configuration/migrations/parallelMigrationsPerCluster",
        "/spec/configuration/evictionStrategy",
        "/spec/configuration/obsoleteCPUModels/a~1b",
        "/metadata/labels/app.kubernetes.io~1component",
    ]


def test_drift_tells_bool_from_int() -> None:
    assert drift({"spec": {"a": True}}, {"spec": {"a": 1}}) == ["/spec/a"]
    assert drift({"spec": {"a": [1, 2]}}, {"spec": {"a": [1, 3]}}) == ["/spec/a/1"]


def test_pending_write_reverts_only_owned_drift_and_follows_the_derivation() -> None:
    desired = desired_operands(HyperConverged()).objects["KubeVirt"]
    same = copy.deepcopy(desired)
    foreign = copy.deepcopy(desired)
    foreign["metadata"]["labels"]["someone-else"] = "x"
    edited = copy.deepcopy(desired)
    edited["spec"]["uninstallStrategy"] = "RemoveWorkloads"
    for out_of_band in (False, True):
        assert pending_write(desired, same, out_of_band=out_of_band) is None
        assert pending_write(desired, edited, out_of_band=out_of_band) == [
            "/spec/uninstallStrategy"]
    assert pending_write(desired, foreign, out_of_band=True) is None  # nothing HCO owns
    assert pending_write(desired, foreign, out_of_band=False) == []  # HCO's own, rewritten
