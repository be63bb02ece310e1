"""GPUs and host devices through commands and read models on the real store: a VMI asks
the scheduler for one of each device's `deviceName`, as KubeVirt's launcher pod asks
kube-scheduler, so one wanting a device no node offers stays Pending, Unschedulable, saying
which; a node that offers it takes the VMI."""

from __future__ import annotations

from typing import Any

from tests.store.helpers import SyncHandler
from tests.store.scheduling_helpers import Cluster

GPU = "nvidia.com/TU104GL_Tesla_T4"
TWO_GPUS = {"domain": {"resources": {"requests": {"memory": "1Gi"}},
                       "devices": {"gpus": [{"name": "gpu1", "deviceName": GPU},
                                            {"name": "gpu2", "deviceName": GPU}]}}}


def gpus(count: int) -> dict[str, Any]:
    """A node's allocatable count of the GPU, as its device plugin would advertise it."""
    return {GPU: str(count)}


def test_a_vmi_wanting_a_device_no_node_offers_is_unschedulable_naming_it(
        handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("plain")
    c.node("one-gpu", **gpus(1))
    c.vmi("trainer", TWO_GPUS)
    [command] = c.schedule()
    assert command.verb == "unschedulable"
    assert c.message("trainer") == f"0/2 nodes are available: 2 Insufficient {GPU}."

    c.node("two-gpus", **gpus(2))
    [placed] = c.schedule()
    assert (placed.verb, c.node_of("trainer"), c.pod_scheduled("trainer")) == (
        "schedule", "two-gpus", [])
