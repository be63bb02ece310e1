"""The VM lifecycle through the client against the running system, per run strategy."""

from __future__ import annotations

import pytest

from controlplane.client import Client, CommandRejected
from tests.system.harness import (
    domains,
    eventually,
    no_domains,
    replaced,
    vm_manifest,
    vm_status,
    vmi_absent,
    vmi_phase,
)


async def test_always_vm_runs_and_stops(vb: Client) -> None:
    [outcome] = await vb.apply(vm_manifest("web"))
    assert outcome.accepted and outcome.sequences
    vmi = await eventually(lambda: vmi_phase(vb, "web", "Running"), what="VMI Running")
    node = vmi["status"]["nodeName"]
    assert node in ("node-1", "node-2")
    assert [d.uid for d in await domains(vb, node)] == [vmi["metadata"]["uid"]]
    vm = await vb.get("VirtualMachine", "default", "web")
    assert vm["status"]["ready"] is True and vm["status"]["printableStatus"] == "Running"

    await vb.act("VirtualMachine", "stop", "default", "web")
    await eventually(lambda: vm_status(vb, "web", "Stopped"), what="VM Stopped")
    assert await vb.query("VirtualMachineInstance", "default", "web") == []
    assert await eventually(lambda: no_domains(vb, node), what="domain gone")
    vm = await vb.get("VirtualMachine", "default", "web")
    assert vm["spec"]["runStrategy"] == "Halted"


async def test_start_and_stop_follow_kubevirt_per_run_strategy(vb: Client) -> None:
    await vb.apply(vm_manifest("halted", "Halted"), vm_manifest("manual", "Manual"))
    with pytest.raises(CommandRejected, match=r"^VM is not running$"):
        await vb.act("VirtualMachine", "stop", "default", "halted")
    await vb.act("VirtualMachine", "start", "default", "halted")
    await eventually(lambda: vmi_phase(vb, "halted", "Running"), what="halted VM started")
    assert (await vb.get("VirtualMachine", "default", "halted"))["spec"]["runStrategy"] == \
        "Always"
    with pytest.raises(CommandRejected, match="VM is already running"):
        await vb.act("VirtualMachine", "start", "default", "halted")

    assert await vb.query("VirtualMachineInstance", "default", "manual") == []
    await vb.act("VirtualMachine", "start", "default", "manual")
    await eventually(lambda: vmi_phase(vb, "manual", "Running"), what="manual VM started")
    with pytest.raises(CommandRejected, match="already running"):
        await vb.act("VirtualMachine", "start", "default", "manual")
    await vb.act("VirtualMachine", "stop", "default", "manual")
    await eventually(lambda: vm_status(vb, "manual", "Stopped"), what="manual VM stopped")
    assert (await vb.get("VirtualMachine", "default", "manual"))["spec"]["runStrategy"] == \
        "Manual"


async def test_restart_replaces_the_vmi(vb: Client) -> None:
    await vb.apply(vm_manifest("rs"))
    first = await eventually(lambda: vmi_phase(vb, "rs", "Running"), what="first VMI")
    await vb.act("VirtualMachine", "restart", "default", "rs")
    second = await eventually(lambda: replaced(vb, "rs", first["metadata"]["uid"]),
                              what="a new VMI after restart")
    assert (await vb.get("VirtualMachine", "default", "rs"))["status"]["restartCount"] == 1
    node = second["status"]["nodeName"]
    assert [d.uid for d in await domains(vb, node)] == [second["metadata"]["uid"]]


async def test_delete_vm_removes_its_vmi(vb: Client) -> None:
    await vb.apply(vm_manifest("gone"))
    vmi = await eventually(lambda: vmi_phase(vb, "gone", "Running"), what="VMI Running")
    await vb.act("VirtualMachine", "delete", "default", "gone")
    assert await eventually(lambda: no_domains(vb, vmi["status"]["nodeName"]),
                            what="domain removed")
    assert await vb.query("VirtualMachine", "default", "gone") == []
    assert await eventually(lambda: vmi_absent(vb, "gone"), what="VMI removed")
