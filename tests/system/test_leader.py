"""Several control-plane replicas: one leads through the KV lease, the others stand by, and
when the leader dies one of them takes over without losing a command."""

from __future__ import annotations

from controlplane.lease import LEASE_KEY
from controlplane.user.client import Client
from tests.system.harness import System, eventually, vm_manifest, vmi_phase


async def leader(vb: Client) -> str:
    kv = await vb.js.key_value(vb.layout.leases_bucket)
    entry = await kv.get(LEASE_KEY)
    return (entry.value or b"").decode()


async def test_a_standby_takes_over_when_the_leader_is_killed(system: System,
                                                            vb: Client) -> None:
    system.add_replica("cp-b")
    system.start("cp-b")
    assert await leader(vb) == "cp-a"
    await vb.apply(vm_manifest("before"))
    await eventually(lambda: vmi_phase(vb, "before", "Running"), what="leader works")

    system.kill("controlplane")
    command = vb.command("VirtualMachine", "apply", manifest=vm_manifest("after"))
    await vb.submit(command)
    outcome = await vb.outcome(command.id, timeout=40)
    assert outcome.accepted
    assert await leader(vb) == "cp-b"
    await eventually(lambda: vmi_phase(vb, "after", "Running"), what="standby leads")
    history = await vb.history("VirtualMachineInstance", "default", "after")
    assert {h.actor for h in history} >= {"system:controller:vm", "system:controller:scheduler"}
