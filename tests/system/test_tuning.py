"""The scheduler reads the effective KubeVirt configuration: the HyperConverged's
`vmiCPUAllocationRatio` and `memoryOvercommitPercentage` change what a VMI holds on a node."""

from __future__ import annotations

from typing import Any

from controlplane.user.client import Client
from events.api import hco_defaults as d
from tests.system.harness import eventually, vmi_phase

MiB = 1024 * 1024


def guest_only(name: str) -> dict[str, Any]:
    """A VM that sets `memory.guest` and no requests: its ask follows the cluster's knobs."""
    return {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {
            "cpu": {"cores": 4}, "memory": {"guest": "1Gi"}, "devices": {}}}}},
    }


async def held(vb: Client, node: str) -> dict[str, str]:
    [obj] = await vb.query("Node", name=node)
    allocated: dict[str, str] = obj["status"]["allocated"]
    return allocated


async def tuned(vb: Client, ratio: int, overcommit: int) -> bool:
    [kubevirt] = await vb.query("KubeVirt", name=f"kubevirt-{d.DEFAULT_NAME}")
    config = kubevirt["spec"]["configuration"]["developerConfiguration"]
    return bool(config["cpuAllocationRatio"] == ratio
                and config["memoryOvercommit"] == overcommit)


async def test_allocation_ratio_and_memory_overcommit_reach_the_scheduler(vb: Client) -> None:
    await eventually(lambda: tuned(vb, 10, 100), what="default KubeVirt configuration")
    await vb.apply(guest_only("dense"))
    vmi = await eventually(lambda: vmi_phase(vb, "dense", "Running"), what="VMI Running")
    node = vmi["status"]["nodeName"]
    before = await held(vb, node)
    assert before["cpu"] == "400m"  # 4 vCPUs at the default ratio 10

    await vb.patch("HyperConverged", d.DEFAULT_NAMESPACE, d.DEFAULT_NAME, {"spec": {
        "resourceRequirements": {"vmiCPUAllocationRatio": 4},
        "higherWorkloadDensity": {"memoryOvercommitPercentage": 200}}})
    await eventually(lambda: tuned(vb, 4, 200), what="KubeVirt configuration follows HCO")
    after = await held(vb, node)
    assert after["cpu"] == "1000m"
    assert int(before["memory"]) - int(after["memory"]) == 512 * MiB
