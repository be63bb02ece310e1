"""The VM lifecycle through the client against the running system, per run strategy."""

from __future__ import annotations

import pytest

from controlplane.user.client import Client, CommandRejected
from tests.system.harness import (
    System,
    domains,
    eventually,
    no_domains,
    replaced,
    vm_manifest,
    vm_status,
    vmi_absent,
    vmi_phase,
)
from tests.system.test_guests import virtbus


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


async def test_rerun_on_failure_and_once_on_real_guests(system: System, vb: Client) -> None:
    """RerunOnFailure replaces a crashed guest, not one shut down; Once replaces neither."""
    names = ("rerun-crash", "rerun-down", "once-crash", "once-down")
    await vb.apply(*(vm_manifest(n, "RerunOnFailure" if n.startswith("rerun") else "Once")
                     for n in names))
    first = {}
    for name in names:
        vmi = await eventually(lambda n=name: vmi_phase(vb, n, "Running"), what=f"{name} up")
        first[name] = vmi["metadata"]["uid"]
    for name in names:
        action = "guest-crash" if name.endswith("crash") else "guest-shutdown"
        done = await virtbus(system, "sim", action, name)
        assert done.code == 0, done.err

    await eventually(lambda: replaced(vb, "rerun-crash", first["rerun-crash"]),
                     what="the crashed RerunOnFailure guest rerun")
    await eventually(lambda: vm_status(vb, "rerun-down", "Stopped"), what="rerun-down done")
    for name, phase in (("once-crash", "Failed"), ("once-down", "Succeeded")):
        await eventually(lambda n=name, p=phase: vmi_phase(vb, n, p), what=f"{name} {phase}")
    # The controller acts on the log in order: once it has started a VM applied after
    # these outcomes, whatever they made it do is done.
    await vb.apply(vm_manifest("marker"))
    await eventually(lambda: vmi_phase(vb, "marker", "Running"), what="marker up")
    assert await vb.query("VirtualMachineInstance", "default", "rerun-down") == []
    for name in ("once-crash", "once-down"):
        [vmi] = await vb.query("VirtualMachineInstance", "default", name)
        assert vmi["metadata"]["uid"] == first[name]
        vm = await vb.get("VirtualMachine", "default", name)
        assert vm["status"]["printableStatus"] == "Stopped"
