"""Guests and hosts through the `virtbus` CLI against the running system: host discovery on
the node, pause / unpause, grace periods, simulated guest and agent failures, and an agent
killed and restarted that keeps its guests."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import libvirt
import yaml

from controlplane.user.client import Client
from tests.system.harness import (
    WAIT_SECONDS,
    System,
    condition,
    domains,
    eventually,
    hosted,
    no_domains,
    node_ready,
    replaced,
    vm_manifest,
    vm_status,
    vmi_phase,
)

NODE_GRACE_SECONDS = 10.0
"""Longer than an agent's restart after `kill -9` on a busy machine (its interpreter, libvirt
and discovery start before its first heartbeat): the restarted agent must adopt its guest,
not find it failed for a silence that was only its own start."""


class Run:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


async def virtbus(system: System, *args: str) -> Run:
    """The real CLI, as its own process, pointed at the system under test."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controlplane.user.cli", "--nats-url", system.nats_url,
        "--prefix", system.prefix, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), WAIT_SECONDS)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


def vmi_manifest(name: str) -> dict[str, Any]:
    spec = vm_manifest(name)["spec"]["template"]["spec"]
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


async def reasons(vb: Client, name: str) -> list[str]:
    """Every `status.reason` the VMI named `name` has had, across its instances."""
    return [c["value"] for e in await vb.history("VirtualMachineInstance", "default", name)
            for c in e.changes if c["path"] == "/status/reason" and c["op"] != "remove"]


def running(vb: Client, name: str) -> Callable[[], Awaitable[dict[str, Any] | None]]:
    return lambda: vmi_phase(vb, name, "Running")


async def test_node_discovery_pause_unpause_and_grace_periods(system: System, vb: Client) -> None:
    shown = await virtbus(system, "get", "node", "node-1", "-o", "yaml")
    assert shown.code == 0, shown.err
    node = yaml.safe_load(shown.out)
    for resource in ("devices.kubevirt.io/kvm", "devices.kubevirt.io/tun"):
        assert node["status"]["capacity"][resource] == "110"
        assert node["status"]["allocatable"][resource] == "110"
    labels = node["metadata"]["labels"]
    assert labels["cpu-model.node.kubevirt.io/Haswell-noTSX"] == "true"
    assert any(k.startswith("cpu-feature.node.kubevirt.io/") for k in labels)

    await vb.apply(vm_manifest("web"), vm_manifest("off", "Halted"))
    refused = await virtbus(system, "pause", "off")
    assert (refused.code, refused.err) == (1, "error: VMI is not running\n")
    vmi = await eventually(lambda: vmi_phase(vb, "web", "Running"), what="VMI Running")
    refused = await virtbus(system, "unpause", "web")
    assert (refused.code, refused.err) == (1, "error: VMI is not paused\n")

    paused = await virtbus(system, "pause", "web")
    assert paused.out == "VMI web was scheduled to pause\n"
    vm = await eventually(lambda: vm_status(vb, "web", "Paused"), what="VM Paused")
    cond = condition(vm, "Paused")
    assert cond is not None and cond["reason"] == "PausedUserRequested"
    cond = condition(await vb.get("VirtualMachineInstance", "default", "web"), "Paused")
    assert cond is not None and cond["reason"] == "PausedUserRequested"
    node_name = vmi["status"]["nodeName"]
    assert [d.state for d in await domains(vb, node_name)] == [libvirt.VIR_DOMAIN_PAUSED]
    refused = await virtbus(system, "pause", "web")
    assert (refused.code, refused.err) == (1, "error: VMI is already paused\n")
    refused = await virtbus(system, "soft-reboot", "web")
    assert (refused.code, refused.err) == (1, "error: VMI is paused; unpause it first\n")

    assert (await virtbus(system, "unpause", "web")).code == 0
    vm = await eventually(lambda: vm_status(vb, "web", "Running"), what="VM running again")
    assert condition(vm, "Paused") is None
    assert [d.state for d in await domains(vb, node_name)] == [libvirt.VIR_DOMAIN_RUNNING]
    rebooted = await virtbus(system, "soft-reboot", "web")
    assert rebooted.out == "VMI web was scheduled to soft reboot\n"

    # A grace period of 0 destroys at once; the spec's (30 s) asks the guest, which on the
    # test driver powers off at once.
    await vb.apply(vmi_manifest("forced"), vmi_manifest("polite"))
    for name in ("forced", "polite"):
        await eventually(running(vb, name), what=f"{name} Running")
    assert (await virtbus(system, "delete", "vmi", "forced", "--grace-period", "0")).code == 0
    assert (await virtbus(system, "delete", "vmi", "polite")).code == 0
    for name, outcome in (("forced", "Destroyed"), ("polite", "ShutDown")):
        found = await eventually(partial(_gone_with, vb, name), what=f"{name} deleted")
        assert f"stopped on request ({outcome})" in found


async def _gone_with(vb: Client, name: str) -> list[str] | None:
    if await vb.query("VirtualMachineInstance", "default", name):
        return None
    return await reasons(vb, name)


async def test_simulated_guest_shutdown_crash_and_io_error(system: System, vb: Client) -> None:
    await vb.apply(vm_manifest("down"), vm_manifest("crash"), vmi_manifest("lone"),
                   vm_manifest("disk"))
    first = {}
    for name in ("down", "crash", "lone", "disk"):
        vmi = await eventually(running(vb, name), what=f"{name} Running")
        first[name] = vmi["metadata"]["uid"]

    for action, name in (("guest-shutdown", "down"), ("guest-crash", "crash"),
                         ("guest-crash", "lone")):
        done = await virtbus(system, "sim", action, name)
        assert done.code == 0, done.err

    # runStrategy Always replaces a finished VMI; a standalone one stays Failed.
    for name in ("down", "crash"):
        await eventually(partial(replaced, vb, name, first[name]), what=f"{name} replaced")
    lone = await eventually(lambda: vmi_phase(vb, "lone", "Failed"), what="lone VMI Failed")
    assert lone["status"]["reason"] == "guest crash"
    assert "guest shutdown" in await reasons(vb, "down")
    assert "guest crash" in await reasons(vb, "crash")
    history = await vb.history("VirtualMachineInstance", "default", "down")
    assert "/status/phase" in {c["path"] for e in history for c in e.changes
                               if c.get("value") == "Succeeded"}
    owned = {d.uid for node in ("node-1", "node-2") for d in await domains(vb, node)}
    assert not owned & {first[n] for n in ("down", "crash", "lone")}, \
        "a finished guest's domain was left behind"

    # A disk I/O error pauses the guest; it stays Running with virt-handler's reason, and
    # unpausing it is the user's call.
    assert (await virtbus(system, "sim", "guest-io-error", "disk")).code == 0
    vm = await eventually(lambda: vm_status(vb, "disk", "Paused"), what="VM Paused")
    cond = condition(vm, "Paused")
    assert cond is not None
    assert (cond["reason"], cond["message"]) == (
        "PausedIOError", "VMI was paused, low-level IO error detected")
    vmi = await vb.get("VirtualMachineInstance", "default", "disk")
    assert vmi["status"]["phase"] == "Running"
    assert (await virtbus(system, "unpause", "disk")).code == 0
    vm = await eventually(lambda: vm_status(vb, "disk", "Running"), what="VM running again")
    assert condition(vm, "Paused") is None


async def test_agent_stop_start_and_kill(system: System, vb: Client) -> None:
    await vb.apply(vm_manifest("mover"))
    vmi = await eventually(lambda: vmi_phase(vb, "mover", "Running"), what="VMI Running")
    node, uid = vmi["status"]["nodeName"], vmi["metadata"]["uid"]
    other = "node-2" if node == "node-1" else "node-1"

    stopped = await virtbus(system, "sim", "agent-stop", node)
    assert stopped.code == 0, stopped.err
    await eventually(lambda: node_ready(vb, node, False), what=f"{node} NotReady")
    moved = await eventually(lambda: replaced(vb, "mover", uid), what="VMI rescheduled")
    assert moved["status"]["nodeName"] == other
    assert "NodeUnresponsive" in await reasons(vb, "mover")

    started = await virtbus(system, "sim", "agent-start", node)
    assert started.code == 0, started.err
    await eventually(lambda: node_ready(vb, node, True), what=f"{node} Ready again")
    await eventually(lambda: no_domains(vb, node), what="the stale domain removed")

    # kill -9: the simulated host is kept in a file (--sim-state), so the restarted agent
    # adopts the guest as on a real hypervisor. It takes work only once it has reconciled, so
    # a pause it carries out shows that reconciling kept the guest: same VMI, node, one domain.
    uid = moved["metadata"]["uid"]
    system.kill(other)
    system.start(other)
    paused = await virtbus(system, "pause", "mover")
    assert paused.code == 0, paused.err
    await eventually(lambda: vm_status(vb, "mover", "Paused"), what="paused by the new agent")
    vmi = await eventually(running(vb, "mover"), what="VMI Running")
    assert (vmi["metadata"]["uid"], vmi["status"]["nodeName"]) == (uid, other)
    assert [d.state for d in await hosted(vb, uid)] == [libvirt.VIR_DOMAIN_PAUSED]
    assert "domain missing after agent restart" not in await reasons(vb, "mover")
