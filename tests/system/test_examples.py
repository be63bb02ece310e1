"""The examples run against a live system and say what they claim."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from controlplane.user.client import Client
from events.api.manifest import parse_documents
from tests.system.harness import System, eventually, vm_manifest, vmi_phase

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def test_audit_example_prints_history_and_past_state(system: System, vb: Client) -> None:
    await vb.apply(vm_manifest("audited"))
    await eventually(lambda: vmi_phase(vb, "audited", "Running"), what="VM running")
    running_at = datetime.now(UTC)
    await vb.act("VirtualMachine", "stop", "default", "audited")
    env = {**os.environ, "VIRTBUS_NATS_URL": system.nats_url, "VIRTBUS_PREFIX": system.prefix}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(EXAMPLES / "audit.py"), "audited",
                         running_at.isoformat()],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "user:alice VirtualMachineCreated" in lines[0]
    assert "user:alice VirtualMachineRunStrategyChanged" in lines[1]
    assert lines[-1].endswith(": Running, runStrategy Always")


async def test_every_example_is_accepted_and_instancetypes_size_their_vms(
        system: System, vb: Client) -> None:
    """Every manifest of `examples/` applies (instancetypes before the VMs naming them, as
    their file names sort); the VM sized by u1.small runs with its shape, the seed's stopped
    csmall VM is pinned at its start, the windows preference gives its VM sata, a TPM and
    Secure Boot, and a VM naming cx1.large is refused for what a virtbus
    VMI cannot hold yet."""
    written = 0
    for path in sorted(EXAMPLES.glob("*.yaml")):
        outcomes = await vb.apply(*parse_documents(path.read_text(), path.name))
        assert all(o.accepted for o in outcomes), path.name
        written = max([written, *(s for o in outcomes for s in o.sequences)])
    # Read once the read model holds every event the applies wrote.
    cluster_types = await vb.query("VirtualMachineClusterInstancetype", after=written)
    assert [o["metadata"]["name"] for o in cluster_types] == [
        "cx1.large", "o1.medium", "u1.medium", "u1.micro", "u1.nano", "u1.small"]

    small = await eventually(lambda: vmi_phase(vb, "small", "Running"), what="small running")
    domain = small["spec"]["domain"]
    assert (domain["cpu"]["sockets"], domain["memory"]["guest"]) == (1, "2Gi")
    assert [d["disk"]["bus"] for d in domain["devices"]["disks"]] == ["virtio", "virtio"]
    assert domain["devices"]["rng"] == {}

    await vb.act("VirtualMachine", "start", "default", "vm-cirros-csmall")
    csmall = await eventually(lambda: vmi_phase(vb, "vm-cirros-csmall", "Running"),
                              what="vm-cirros-csmall running")
    assert csmall["spec"]["domain"]["memory"] == {"guest": "128Mi"}
    source = await vb.get("VirtualMachineInstancetype", "default", "csmall")
    pinned = await vb.get("VirtualMachine", "default", "vm-cirros-csmall")
    revision = f"vm-cirros-csmall-csmall-{source['metadata']['uid']}-1"
    assert pinned["spec"]["instancetype"]["revisionName"] == revision
    assert (await vb.get("ControllerRevision", "default", revision))["data"]["kind"] == \
        "VirtualMachineInstancetype"

    await vb.act("VirtualMachine", "start", "default", "windows")
    windows = await eventually(lambda: vb.query("VirtualMachineInstance", "default", "windows"),
                               what="windows' VMI")
    domain = windows[0]["spec"]["domain"]
    assert (domain["cpu"]["sockets"], domain["memory"]["guest"]) == (1, "1Gi")
    assert [d["disk"]["bus"] for d in domain["devices"]["disks"]] == ["sata"]
    assert domain["devices"]["tpm"] == {}
    assert domain["firmware"]["bootloader"] == {"efi": {"secureBoot": True}}
    assert domain["features"]["smm"] == {}

    exclusive = {**vm_manifest("exclusive"), "spec": {
        "runStrategy": "Halted", "instancetype": {"name": "cx1.large"},
        "template": {"spec": {"domain": {"devices": {}}}}}}
    # cx1.large's ioThreadsPolicy and cpu.numa are the VMI's now (a virtbus VMI holds them).
    [taken] = await vb.apply(exclusive, check=False)
    assert taken.accepted, taken.reason
