"""Domain type by hypervisor: test driver, KVM, or plain QEMU emulation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeagent.converter import ConverterContext, hypervisor_domain_type

if TYPE_CHECKING:
    import pathlib


def test_test_driver_gets_type_test() -> None:
    assert hypervisor_domain_type("test:///default") == "test"


def test_kvm_when_device_exists(tmp_path: pathlib.Path) -> None:
    kvm = tmp_path / "kvm"
    kvm.touch()
    assert hypervisor_domain_type("qemu:///system", kvm_device=str(kvm)) == "kvm"


def test_qemu_emulation_without_kvm(tmp_path: pathlib.Path) -> None:
    missing = str(tmp_path / "kvm")
    assert hypervisor_domain_type("qemu:///system", kvm_device=missing) == "qemu"


def test_domain_name_and_paths() -> None:
    ctx = ConverterContext(name="vm", namespace="ns", disk_dir="/d", run_dir="/r")
    assert ctx.domain_name == "ns_vm"
    assert ctx.disk_path == "/d/ns/vm"
    assert ctx.socket_path == "/r/ns/vm"
