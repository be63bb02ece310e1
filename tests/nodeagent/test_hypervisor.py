"""Hypervisor choice: the KVM probe boots for real (TCG shows the probe firmware reaches
long mode), the flags and the cluster's useEmulation override it, and the node's capacity
and domain type follow."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from events.api.resources import KVM_DEVICE, TUN_DEVICE
from nodeagent.agent import host_for
from nodeagent.config import AgentConfig
from nodeagent.discovery import DiscoveryConfig, discover_host
from nodeagent.hypervisor import Hypervisor, kvm_runs_guests, probe
from tests.realhost import QEMU, require

if TYPE_CHECKING:
    import pathlib

    import libvirt

PROBE_SECONDS = 30.0
"""A deadline, not a measure: TCG reaches long mode in milliseconds."""


def test_the_probe_firmware_reaches_long_mode_under_tcg() -> None:
    result = probe(require(QEMU, "qemu-system-x86"), PROBE_SECONDS, accel="tcg")
    assert result.runs_guests, result.why


def test_an_emulator_that_does_not_start_is_no_kvm(tmp_path: pathlib.Path) -> None:
    result = probe(str(tmp_path / "no-such-qemu"), PROBE_SECONDS)
    assert not result.runs_guests
    assert "did not start" in result.why


def test_an_emulator_that_exits_otherwise_is_no_kvm() -> None:
    result = probe("/bin/false", PROBE_SECONDS)
    assert (result.runs_guests, result.why) == (False, "the kvm probe exited 1: no message")


@pytest.mark.parametrize(("choice", "kvm"), [("kvm", True), ("qemu", False)])
def test_the_flag_decides_without_a_probe(choice: str, kvm: bool) -> None:
    assert kvm_runs_guests("<capabilities/>", choice, PROBE_SECONDS) is kvm  # type: ignore[arg-type]


def test_without_kvm_in_libvirt_there_is_no_probe() -> None:
    caps = ("<capabilities><host><cpu><arch>x86_64</arch></cpu></host><guest><arch "
            "name='x86_64'><emulator>/bin/false</emulator><domain type='qemu'/></arch></guest>"
            "</capabilities>")
    assert kvm_runs_guests(caps, "auto", PROBE_SECONDS) is False


def test_the_test_driver_is_never_kvm() -> None:
    host = host_for(AgentConfig(node="n1", nats_url="nats://127.0.0.1:1",
                                libvirt_uri="test:///default", hypervisor="kvm"))
    host.use_emulation(False)
    assert host.domain_type == "test"


def test_use_emulation_makes_guests_qemu_where_kvm_runs() -> None:
    assert Hypervisor(kvm=True).domain_type == "kvm"
    assert Hypervisor(kvm=True, use_emulation=True).domain_type == "qemu"
    assert Hypervisor(kvm=False).domain_type == "qemu"


def test_an_emulating_node_offers_no_kvm_device(conn: libvirt.virConnect) -> None:
    info = discover_host(conn, DiscoveryConfig(node_name="n1", domain_type="qemu"))
    assert info.domain_type == "qemu"
    assert (info.capacity[KVM_DEVICE], info.allocatable[KVM_DEVICE]) == ("0", "0")
    assert info.capacity[TUN_DEVICE] == "110"
    kvm = discover_host(conn, DiscoveryConfig(node_name="n1", domain_type="kvm"))
    assert kvm.capacity[KVM_DEVICE] == "110"
