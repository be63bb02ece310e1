"""The HyperConverged end to end: commands in, operands derived and reverted, conditions,
metrics and alerts out of the read service, all through the running system."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.user.client import Client, CommandRejected
from events.api import hco_defaults as d
from events.language.query import Query
from projections import audit
from projections.hco import ALERTS_QUERY, METRICS_QUERY
from projections.hco_metrics import OUT_OF_BAND_MODIFICATIONS, UNSAFE_MODIFICATIONS
from projections.rendering import render
from tests.system.harness import (
    System,
    command_topics_since,
    condition,
    eventually,
    last_sequence,
    topics_since,
    vm_manifest,
)

KUBEVIRT_CR = f"kubevirt-{d.DEFAULT_NAME}"
HCO = "HyperConverged"


async def reconciled(vb: Client, **condition: str) -> dict[str, Any] | None:
    """The HyperConverged once reconciled at its generation, with the given condition
    statuses (`TaintedConfiguration="True"`; "absent" for a condition not reported). Read
    after everything written so far: a read model that has not yet seen the last patch
    shows the previous generation, reconciled."""
    items = await vb.query(HCO, name=d.DEFAULT_NAME, after=await last_sequence(vb))
    if not items:
        return None
    hco = items[0]
    status = hco["status"]
    found = {c["type"]: c["status"] for c in status["conditions"]}
    want = {"ReconcileComplete": "True", **condition}
    if status["observedGeneration"] != hco["metadata"]["generation"]:
        return None
    if any(found.get(t, "absent") != s for t, s in want.items()):
        return None
    return hco


async def kubevirt(vb: Client) -> dict[str, Any]:
    return await vb.get("KubeVirt", "", KUBEVIRT_CR)


def sample(text: str, metric: str, label: str, value: str) -> float | None:
    prefix = f'{metric}{{{label}="{value}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return None


async def test_out_of_band_change_is_reverted_counted_alerted_and_survives_restart(
    system: System, vb: Client
) -> None:
    await eventually(lambda: reconciled(vb), what="the default HyperConverged reconciled")
    effective = await kubevirt(vb)
    migrations = effective["spec"]["configuration"]["migrations"]
    assert migrations["completionTimeoutPerGiB"] == d.COMPLETION_TIMEOUT_PER_GIB
    assert migrations["allowPostCopy"] is False
    hco = await vb.get(HCO, "", d.DEFAULT_NAME)
    assert {r["kind"] for r in hco["status"]["relatedObjects"]} == set(d.OPERAND_API_VERSIONS)

    edited = {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
              "metadata": {"name": KUBEVIRT_CR, "labels": effective["metadata"]["labels"]},
              "spec": {**effective["spec"], "configuration": {
                  **effective["spec"]["configuration"],
                  "migrations": {**migrations, "allowPostCopy": True}}}}
    [outcome] = await vb.apply(edited)
    assert outcome.sequences

    async def reverted() -> list[Any] | None:
        history = await vb.history("KubeVirt", "", KUBEVIRT_CR)
        types = [(e.type, e.actor) for e in history]
        return history if ("OperandReverted", "system:controller:hco") in types else None

    history = await eventually(reverted, what="the out-of-band change reverted")
    actors = [(e.type, e.actor) for e in history]
    assert ("OperandModified", "user:alice") in actors
    assert actors.index(("OperandModified", "user:alice")) < actors.index(
        ("OperandReverted", "system:controller:hco"))
    revert = next(e for e in history if e.type == "OperandReverted")
    assert {"op": "replace", "path": "/spec/configuration/migrations/allowPostCopy",
            "value": False} in revert.changes
    assert (await kubevirt(vb))["spec"]["configuration"]["migrations"]["allowPostCopy"] is False

    head = await last_sequence(vb)
    [exposition] = await vb.query(METRICS_QUERY, after=head)
    text = exposition["text"]
    assert sample(text, OUT_OF_BAND_MODIFICATIONS, "component_name", KUBEVIRT_CR) == 1.0
    alerts = await vb.query(ALERTS_QUERY, after=head)
    assert [(a["name"], a["severity"], a["labels"]) for a in alerts] == [
        ("KubeVirtCRModified", "warning", {"component_name": KUBEVIRT_CR})]

    system.kill("projections")
    system.start("projections")
    again = await eventually(lambda: vb.query(METRICS_QUERY, after=head),
                             what="the restarted read service")
    assert again[0]["text"] == text
    assert await vb.query(ALERTS_QUERY, after=head) == alerts
    rebuilt = await audit.state_at(vb.nc, vb.layout, head)
    assert render(rebuilt, Query(kind=METRICS_QUERY))[0]["text"] == text


async def test_cluster_configuration_sections(vb: Client) -> None:
    """One system, the seed's sections in turn."""
    await eventually(lambda: reconciled(vb), what="the default HyperConverged reconciled")
    await spec_reaches_kubevirt(vb)
    await validation_refuses_and_appends_nothing(vb)
    await jsonpatch_annotations(vb)
    await uninstall_strategies(vb)


async def spec_reaches_kubevirt(vb: Client) -> None:
    """featureGates, liveMigrationConfig, obsoleteCPUs and defaultCPUModel."""
    await vb.patch(HCO, "", d.DEFAULT_NAME, {"spec": {
        "featureGates": {"downwardMetrics": True},
        "liveMigrationConfig": {"parallelMigrationsPerCluster": 3, "allowAutoConverge": True},
        "obsoleteCPUs": {"cpuModels": ["Haswell"], "minCPUModel": "Nehalem"},
        "defaultCPUModel": "Skylake-Server",
    }})
    await eventually(lambda: reconciled(vb), what="the patched spec reconciled")
    config = (await kubevirt(vb))["spec"]["configuration"]
    assert "DownwardMetrics" in config["developerConfiguration"]["featureGates"]
    assert config["migrations"]["parallelMigrationsPerCluster"] == 3
    assert config["migrations"]["allowAutoConverge"] is True
    assert config["obsoleteCPUModels"]["Haswell"] is True
    assert config["minCPUModel"] == "Nehalem"
    assert config["cpuModel"] == "Skylake-Server"
    await vb.apply(vm_manifest("cpu"))
    vmi = await eventually(lambda: vb.query("VirtualMachineInstance", "default", "cpu"),
                           what="the VMI of a VM without a CPU model")
    assert vmi[0]["spec"]["domain"]["cpu"]["model"] == "Skylake-Server"


async def validation_refuses_and_appends_nothing(vb: Client) -> None:
    before = await last_sequence(vb)
    for patch, field in (
        ({"spec": {"certConfig": {"server": {"duration": "96h"}}}},
         "spec.certConfig.server.duration"),
        ({"spec": {"certConfig": {"ca": {"duration": "5m"}}}}, "spec.certConfig.ca.duration"),
        ({"spec": {"tuningPolicy": "annotation"}}, "spec.tuningPolicy"),
        ({"spec": {"resourceRequirements": {"vmiCPUAllocationRatio": 1,
                                            "autoCPULimitNamespaceLabelSelector": {}}}},
         "spec.resourceRequirements.autoCPULimitNamespaceLabelSelector"),
    ):
        with pytest.raises(CommandRejected) as refused:
            await vb.patch(HCO, "", d.DEFAULT_NAME, patch)
        assert refused.value.outcome.field == field, refused.value.outcome
    # Each refusal is recorded (final); nothing of the configuration changed. (The VM
    # applied just before keeps appending its VMI's lifecycle meanwhile.)
    topics = await topics_since(vb, before)
    assert topics.count("CommandRejected.v1") >= 4
    assert [t for t in topics if t.startswith(("HyperConverged", "Operand"))] == []


async def jsonpatch_annotations(vb: Client) -> None:
    """Applied, tainted, counted, alerted, not reverted; a patch that does not apply is
    reported on the conditions and changes nothing; removing them removes the taint."""
    patch = '[{"op": "add", "path": "/spec/configuration/migrations/allowPostCopy", ' \
            '"value": true}]'
    await vb.patch(HCO, "", d.DEFAULT_NAME,
                   {"metadata": {"annotations": {d.KUBEVIRT_JSONPATCH_ANNOTATION: patch}}})
    hco = await eventually(lambda: reconciled(vb, TaintedConfiguration="True"),
                           what="TaintedConfiguration")
    tainted = condition(hco, "TaintedConfiguration")
    assert tainted is not None and tainted["reason"] == "UnsupportedFeatureAnnotation"
    assert (await kubevirt(vb))["spec"]["configuration"]["migrations"]["allowPostCopy"] is True
    head = await last_sequence(vb)
    [exposition] = await vb.query(METRICS_QUERY, after=head)
    assert sample(exposition["text"], UNSAFE_MODIFICATIONS, "annotation_name",
                  d.KUBEVIRT_JSONPATCH_ANNOTATION) == 1.0
    alerts = await vb.query(ALERTS_QUERY, after=head)
    assert ("UnsupportedHCOModification", "info",
            {"annotation_name": d.KUBEVIRT_JSONPATCH_ANNOTATION}) in [
        (a["name"], a["severity"], a["labels"]) for a in alerts]

    cdi_before = await vb.get("CDI", "", f"cdi-{d.DEFAULT_NAME}")
    bad = '[{"op": "remove", "path": "/spec/nope"}]'
    await vb.patch(HCO, "", d.DEFAULT_NAME,
                   {"metadata": {"annotations": {d.CDI_JSONPATCH_ANNOTATION: bad}},
                    "spec": {"scratchSpaceStorageClass": "fast"}})
    hco = await eventually(lambda: reconciled(vb, ReconcileComplete="False"),
                           what="the failed patch on the conditions")
    failed = condition(hco, "ReconcileComplete")
    assert failed is not None and d.CDI_JSONPATCH_ANNOTATION in failed["message"]
    assert [f["annotation"] for f in hco["status"]["jsonPatchFailures"]] == [
        d.CDI_JSONPATCH_ANNOTATION]
    cdi_after = await vb.get("CDI", "", f"cdi-{d.DEFAULT_NAME}")
    assert cdi_after == cdi_before

    await vb.patch(HCO, "", d.DEFAULT_NAME, {"metadata": {"annotations": {
        d.KUBEVIRT_JSONPATCH_ANNOTATION: None, d.CDI_JSONPATCH_ANNOTATION: None}}})
    await eventually(lambda: reconciled(vb, TaintedConfiguration="absent"), what="untainted")
    assert (await kubevirt(vb))["spec"]["configuration"]["migrations"]["allowPostCopy"] is False
    cdi = await vb.get("CDI", "", f"cdi-{d.DEFAULT_NAME}")
    assert cdi["spec"]["config"]["scratchSpaceStorageClass"] == "fast"


async def uninstall_strategies(vb: Client) -> None:
    """workloads.nodePlacement is frozen while VMs exist; Block refuses, RemoveWorkloads
    deletes the VMs with the HyperConverged and its operands."""
    await vb.apply(vm_manifest("keep", "Halted"))
    before = await last_sequence(vb)
    with pytest.raises(CommandRejected) as refused:
        await vb.patch(HCO, "", d.DEFAULT_NAME, {"spec": {"workloads": {
            "nodePlacement": {"nodeSelector": {"nodeType": "nested-virtualization"}}}}})
    assert refused.value.outcome.field == "spec.workloads.nodePlacement"
    with pytest.raises(CommandRejected) as refused:
        await vb.act(HCO, "delete", "", d.DEFAULT_NAME)
    assert refused.value.outcome.field == "spec.uninstallStrategy"
    assert await command_topics_since(vb, before) == ["CommandRejected.v1"] * 2

    await vb.patch(HCO, "", d.DEFAULT_NAME, {"spec": {"uninstallStrategy": "RemoveWorkloads"}})
    deleted = (await vb.act(HCO, "delete", "", d.DEFAULT_NAME)).sequences[-1]
    assert await vb.query("VirtualMachine", after=deleted) == []
    assert await vb.query(HCO, after=deleted) == []
    assert await vb.query("KubeVirt", after=deleted) == []
