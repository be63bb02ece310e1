"""A real guest through the whole system: `virtbus apply` of a VM, a control plane, a read
service and a real node agent on `qemu:///system` (QEMU under TCG on this machine).

The guest (`tests.realhost`) boots the host's kernel from the node's image store (imported
with `virtbus node import-image`) and prints its containerDisk's first bytes and its NoCloud
user-data on the serial console, which the test reads with `virtbus console`. It opens its
guest agent's channel (the VMI is AgentConnected). It is paused and unpaused, soft-rebooted
(it boots again in the same QEMU), its agent is killed (-9) and restarted (the guest runs on
in the same QEMU process and is adopted, not launched again), and it is stopped: the guest
hears the ACPI power button and powers off, the VMI is Succeeded ("stopped on request
(ShutDown)"), and every overlay, ISO and kernel the agent made is gone with the guest's run
directory. The VM lists no interface, so it gets KubeVirt's pod interface: the guest takes
its address by DHCP and prints it, the VMI's `status.interfaces` reports the same address,
and its tap is gone after the stop.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest
import yaml

from controlplane.up import agent_args
from controlplane.user.client import Client
from nodeagent.converter import defaults as converter_defaults
from nodeagent.converter.context import domain_name
from nodeagent.network import links
from tests.nodeagent.test_real_guest_network import Host as NetworkHost
from tests.realhost import (
    BOOT_DEADLINE_SECONDS,
    BOOT_IMAGE,
    DISK_IMAGE,
    DISK_MARKER,
    URI,
    guest_files,
    guest_spec,
    libvirtd,
)
from tests.system.harness import System, condition, eventually, ready_nodes, vmi_absent, vmi_phase
from tests.system.test_guests import Run, virtbus

__all__ = ["guest_files", "libvirtd"]  # fixtures, used by name

NODE = "node-1"
AGENT_RESTART_GRACE_SECONDS = 300.0
"""The node grace: an agent killed and restarted on a loaded machine (its hypervisor probe
included) must not look like a lost node, whose VMIs would fail."""
DEADLINE_SECONDS = 4 * BOOT_DEADLINE_SECONDS
"""Each wait's deadline, not a measure: TCG on two loaded cores is slow."""


class RealHost:
    """The system under test, the node's host directory (image store, disks) and the
    namespace of this test's guests (their domains and run directories are named by it)."""

    def __init__(self, system: System, host: Path, namespace: str, network: NetworkHost
                 ) -> None:
        self.system, self.host, self.namespace = system, host, namespace
        self.network = network

    async def cli(self, *args: str) -> Run:
        return await virtbus(self.system, *args)

    async def console(self, name: str) -> str:
        shown = await self.cli("console", name, "-n", self.namespace)
        assert shown.code == 0, shown.err
        return shown.out

    async def console_with(self, name: str, text: str, count: int = 1) -> str:
        """The console once `text` shows `count` times."""
        async def probe() -> str | None:
            out = await self.console(name)
            return out if out.count(text) >= count else None

        return await eventually(probe, DEADLINE_SECONDS, f"{text!r} x{count} on the console")


@pytest.fixture
def real_host(libvirtd: None, nats_url: str, prefix: str, tmp_path: Path) -> Iterator[RealHost]:
    host = Path(tempfile.mkdtemp(prefix="virtbus-system-host-", dir="/var/tmp"))
    host.chmod(0o755)  # QEMU's user reads the disks under it
    namespace = f"rg-{uuid.uuid4().hex[:8]}"
    network = NetworkHost(host)
    system = System(nats_url, prefix, tmp_path, nodes=1, node_grace=AGENT_RESTART_GRACE_SECONDS,
                    libvirt_uri=URI)
    system.args[NODE] = [*agent_args(NODE, ["--nats-url", nats_url, "--prefix", prefix], URI,
                                     host), "--image-dir", str(host / "images"),
                         *network.agent_args()]
    try:
        system.start_all()
        yield RealHost(system, host, namespace, network)
    finally:
        system.stop_all()
        conn = libvirt.open(URI)
        for dom in conn.listAllDomains(0):  # what a failed test left
            if dom.name().startswith(f"{namespace}_"):
                with contextlib.suppress(libvirt.libvirtError):
                    dom.destroy()
                with contextlib.suppress(libvirt.libvirtError):
                    dom.undefine()
        conn.close()
        network.tear_down()
        shutil.rmtree(host)
        shutil.rmtree(Path(converter_defaults.RUN_DIR, namespace), ignore_errors=True)


@pytest.fixture
async def vb(real_host: RealHost) -> AsyncIterator[Client]:
    system = real_host.system
    client = await Client.connect(system.nats_url, system.prefix, actor="user:alice")
    try:
        await eventually(lambda: ready_nodes(client, 1), DEADLINE_SECONDS, "the node Ready")
        yield client
    finally:
        await client.close()


def vm_manifest(namespace: str, user_data: str) -> dict[str, Any]:
    spec = guest_spec(DISK_IMAGE, user_data)  # no interface: KubeVirt's pod interface
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "guest", "namespace": namespace},
            "spec": {"runStrategy": "Always", "template": {"spec": spec}}}


def qemu_pid(domain: str) -> int:
    """The PID of the QEMU process running `domain`, as libvirtd records it."""
    return int(Path("/run/libvirt/qemu", f"{domain}.pid").read_text().strip())


def agent_starts(system: System) -> int:
    """How many times the node's agent has reconciled and begun taking work."""
    lines = (system.logs / f"{NODE}.log").read_text(errors="replace").splitlines()
    return sum(1 for line in lines
               if line.startswith("{") and json.loads(line).get("event") == "agent started")


@pytest.mark.timeout(900)  # a real guest booted twice under TCG on a loaded 2-core machine
async def test_a_real_guest_through_virtbus(real_host: RealHost, vb: Client,
                                            guest_files: Path, tmp_path: Path) -> None:
    ns = real_host.namespace
    await _import_images(real_host, guest_files)
    missing = await real_host.cli("console", "guest", "-n", ns)
    assert (missing.code, missing.err) == (
        1, f'error: virtualmachineinstance "{ns}/guest" not found\n')
    user_data = f"hello-{uuid.uuid4().hex[:8]}"
    manifest = tmp_path / "vm.yaml"
    manifest.write_text(yaml.safe_dump(vm_manifest(ns, user_data)))
    applied = await real_host.cli("apply", "-f", str(manifest))
    assert applied.code == 0, applied.err
    vmi = await eventually(lambda: vmi_phase(vb, "guest", "Running", ns), DEADLINE_SECONDS,
                           "the VMI Running")
    uid = vmi["metadata"]["uid"]
    console = await real_host.console_with("guest", "virtbus-guest: ready")
    assert f"virtbus-guest: user-data: {user_data}" in console
    assert f"virtbus-guest: disk: {DISK_MARKER.decode()}" in console
    assert "virtbus-guest: guest agent channel open" in console
    vmi = await eventually(lambda: _agent_connected(vb, ns), DEADLINE_SECONDS,
                           "the AgentConnected condition")
    printed = re.search(r"virtbus-guest: address (\S+)", console)
    assert printed is not None, console
    vmi = await eventually(lambda: _reported_address(vb, ns, printed.group(1)),
                           DEADLINE_SECONDS, "the guest's address in status.interfaces")
    [interface] = vmi["status"]["interfaces"]
    assert (interface["name"], interface["infoSource"]) == ("default", "domain")
    assert len(links.taps_on(real_host.network.bridge)) == 1
    vmi_dir = real_host.host / "disks" / ns / "guest"
    assert {p.name for p in vmi_dir.iterdir()} >= {"root.qcow2", "cidata.iso", "kernel-boot"}

    conn = libvirt.open(URI)
    try:
        await _adopted_after_kill(real_host, vb, conn, uid)
        await _soft_reboot(real_host, vb, conn, uid)
    finally:
        conn.close()

    # A graceful stop: the guest hears the ACPI power button and powers off.
    stopped = await real_host.cli("stop", "guest", "-n", ns)
    assert stopped.code == 0, stopped.err
    await eventually(lambda: vmi_absent(vb, "guest", ns), DEADLINE_SECONDS, "the VMI gone")
    assert "virtbus-guest: power button" in await real_host.console("guest")
    history = await vb.history("VirtualMachineInstance", ns, "guest")
    changes = {(c["path"], c["value"]) for e in history for c in e.changes
               if c["path"] in ("/status/phase", "/status/reason") and c["op"] != "remove"}
    assert {("/status/phase", "Succeeded"),
            ("/status/reason", "stopped on request (ShutDown)")} <= changes
    assert not vmi_dir.exists(), "the overlay, the ISO or the kernel stayed behind"
    assert links.taps_on(real_host.network.bridge) == {}, "the tap stayed behind"
    assert not Path(converter_defaults.RUN_DIR, ns, "guest").exists()


async def _import_images(real_host: RealHost, guest_files: Path) -> None:
    """The disk, kernel and initrd into the node's image store, as an operator does."""
    images = ["--image-dir", str(real_host.host / "images")]
    for reference, source, path in ((DISK_IMAGE, "disk.raw", []),
                                    (BOOT_IMAGE, "vmlinuz", ["--path", "/boot/vmlinuz"]),
                                    (BOOT_IMAGE, "initrd.img", ["--path", "/boot/initrd.img"])):
        imported = await real_host.cli("node", "import-image", reference,
                                       str(guest_files / source), *path, *images)
        assert imported.code == 0, imported.err


async def _adopted_after_kill(real_host: RealHost, vb: Client, conn: libvirt.virConnect,
                              uid: str) -> None:
    """kill -9 of the agent: libvirtd keeps the guest and the next agent adopts it (same
    domain run, same QEMU process, one domain). It takes work only once it has reconciled,
    so the pause it carries out shows the reconcile kept the guest; then an unpause."""
    ns, system = real_host.namespace, real_host.system
    domain = domain_name(ns, "guest")
    launched_id, pid = conn.lookupByName(domain).ID(), qemu_pid(domain)
    system.kill(NODE)
    system.start(NODE)
    await eventually(lambda: _true(agent_starts(system) == 2), DEADLINE_SECONDS,
                     "the agent started again")
    paused = await real_host.cli("pause", "guest", "-n", ns)
    assert paused.code == 0, paused.err
    dom = conn.lookupByName(domain)
    await eventually(lambda: _true(dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED),
                     DEADLINE_SECONDS, "the guest paused")
    vmi = await eventually(lambda: _paused(vb, ns, True), DEADLINE_SECONDS, "Paused")
    assert vmi["metadata"]["uid"] == uid
    assert (dom.ID(), qemu_pid(domain)) == (launched_id, pid), "the guest was relaunched"
    assert [d.name() for d in conn.listAllDomains(0) if d.name().startswith(f"{ns}_")] == [
        domain]
    console = await real_host.console("guest")
    assert console.count("virtbus-guest: ready") == 1, "console output published twice"

    unpaused = await real_host.cli("unpause", "guest", "-n", ns)
    assert unpaused.code == 0, unpaused.err
    await eventually(lambda: _paused(vb, ns, False), DEADLINE_SECONDS, "unpaused")
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING


async def _soft_reboot(real_host: RealHost, vb: Client, conn: libvirt.virConnect,
                       uid: str) -> None:
    """The guest boots again inside the same QEMU process; the VMI stays Running."""
    ns = real_host.namespace
    domain = domain_name(ns, "guest")
    pid = qemu_pid(domain)
    rebooted = await real_host.cli("soft-reboot", "guest", "-n", ns)
    assert rebooted.code == 0, rebooted.err
    await real_host.console_with("guest", "virtbus-guest: ready", count=2)
    assert qemu_pid(domain) == pid
    assert conn.lookupByName(domain).state()[0] == libvirt.VIR_DOMAIN_RUNNING
    vmi = await vmi_phase(vb, "guest", "Running", ns)
    assert vmi is not None
    assert vmi["metadata"]["uid"] == uid


async def _agent_connected(vb: Client, namespace: str) -> dict[str, Any] | None:
    """The Running VMI once it has KubeVirt's AgentConnected condition."""
    vmi = await vmi_phase(vb, "guest", "Running", namespace)
    connected = condition(vmi, "AgentConnected") if vmi is not None else None
    return vmi if connected is not None and connected["status"] == "True" else None


async def _reported_address(vb: Client, namespace: str, address: str) -> dict[str, Any] | None:
    """The Running VMI once its `status.interfaces` reports `address`."""
    vmi = await vmi_phase(vb, "guest", "Running", namespace)
    reported = [i.get("ipAddress") for i in (vmi or {}).get("status", {}).get("interfaces", [])]
    return vmi if reported == [address] else None


async def _true(value: bool) -> bool:
    return value


async def _paused(vb: Client, namespace: str, paused: bool) -> dict[str, Any] | None:
    """The Running VMI once its Paused condition is there (`paused`) or not."""
    vmi = await vmi_phase(vb, "guest", "Running", namespace)
    if vmi is None or (condition(vmi, "Paused") is not None) != paused:
        return None
    return vmi
