"""`startStrategy: Paused` through the running system: the VM's guest is created with its
vCPUs suspended (KubeVirt starts the domain paused), the VM and VMI say Paused, and an
unpause lets it run."""

from __future__ import annotations

import libvirt

from controlplane.user.client import Client
from tests.system.harness import (
    System,
    condition,
    domains,
    eventually,
    vm_manifest,
    vm_status,
    vmi_phase,
)


async def test_a_paused_start_runs_once_unpaused(system: System, vb: Client) -> None:
    await vb.apply(vm_manifest("held", startStrategy="Paused"))
    vm = await eventually(lambda: vm_status(vb, "held", "Paused"), what="VM Paused at start")
    assert condition(vm, "Paused") is not None
    vmi = await eventually(lambda: vmi_phase(vb, "held", "Running"), what="VMI Running")
    assert condition(vmi, "Paused") is not None
    node = vmi["status"]["nodeName"]
    assert [d.state for d in await domains(vb, node)] == [libvirt.VIR_DOMAIN_PAUSED]

    await vb.act("VirtualMachine", "unpause", "default", "held")
    vm = await eventually(lambda: vm_status(vb, "held", "Running"), what="VM running")
    assert condition(vm, "Paused") is None
    assert [d.state for d in await domains(vb, node)] == [libvirt.VIR_DOMAIN_RUNNING]
