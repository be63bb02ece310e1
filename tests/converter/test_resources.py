"""What a VMI asks of a node: the numbers the scheduler and the agent share."""

from __future__ import annotations

import msgspec

from events.api.domain import DomainSpec
from events.api.resources import (
    KVM_DEVICE,
    TUN_DEVICE,
    cpu_topology,
    guest_memory_bytes,
    memory_overhead_bytes,
    vmi_resources,
)

MiB = 1024 * 1024
GiB = 1024 * MiB


def domain(raw: dict[str, object]) -> DomainSpec:
    return msgspec.convert(raw, DomainSpec)


def test_overhead_formula_for_2gi_2_vcpus() -> None:
    spec = domain({"cpu": {"cores": 2}, "resources": {"requests": {"memory": "2Gi"}}})
    # pagetables 2Gi/512 = 4Mi, fixed 220Mi, 2 x 8Mi vCPU, 8Mi IO thread, 32Mi video
    assert memory_overhead_bytes(spec) == (4 + 220 + 16 + 8 + 32) * MiB


def test_headless_drops_video_overhead() -> None:
    spec = domain(
        {
            "resources": {"requests": {"memory": "2Gi"}},
            "devices": {"autoattachGraphicsDevice": False},
        }
    )
    assert memory_overhead_bytes(spec) == (4 + 220 + 8 + 8) * MiB


def test_scheduling_request_adds_overhead_and_devices() -> None:
    spec = domain({"resources": {"requests": {"memory": "1Gi", "cpu": "500m"}}})
    asked = vmi_resources(spec)
    assert asked.memory_bytes == GiB + memory_overhead_bytes(spec)
    assert asked.cpu_millis == 500
    assert asked.extended == {KVM_DEVICE: 1, TUN_DEVICE: 1}


def test_overcommit_guest_overhead_and_no_pod_interface() -> None:
    spec = domain(
        {
            "resources": {"requests": {"memory": "1Gi"}, "overcommitGuestOverhead": True},
            "devices": {"autoattachPodInterface": False},
        }
    )
    asked = vmi_resources(spec, emulation=True)
    assert asked.memory_bytes == GiB
    assert asked.extended == {}


def test_hugepages_are_asked_as_their_own_resource() -> None:
    spec = domain(
        {
            "resources": {"requests": {"memory": "64Mi"}},
            "memory": {"hugepages": {"pageSize": "2Mi"}},
        }
    )
    asked = vmi_resources(spec)
    assert asked.extended["hugepages-2Mi"] == 64 * MiB
    assert asked.memory_bytes == memory_overhead_bytes(spec)


def test_cpu_request_defaults_to_allocation_ratio_and_dedicated_takes_whole_cores() -> None:
    shared = domain({"cpu": {"cores": 4}, "resources": {"requests": {"memory": "1Gi"}}})
    dedicated = domain(
        {
            "cpu": {"cores": 4, "dedicatedCpuPlacement": True},
            "resources": {"requests": {"memory": "1Gi"}},
        }
    )
    assert vmi_resources(shared).cpu_millis == 400
    assert vmi_resources(dedicated).cpu_millis == 4000


def test_guest_memory_precedence() -> None:
    spec = domain({"memory": {"guest": "1Gi"}, "resources": {"requests": {"memory": "512Mi"}}})
    assert guest_memory_bytes(spec) == GiB
    assert guest_memory_bytes(domain({"resources": {"limits": {"memory": "2Gi"}}})) == 2 * GiB


def test_topology_from_cpu_limit_becomes_sockets() -> None:
    spec = domain({"resources": {"requests": {"cpu": 1}, "limits": {"cpu": "3"}}})
    assert cpu_topology(spec) == (3, 1, 1)
    assert cpu_topology(domain({"cpu": {"threads": 2}})).vcpus == 2
