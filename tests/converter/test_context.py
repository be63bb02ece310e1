"""Domain type by hypervisor: test driver, KVM, or plain QEMU emulation; what the context
takes from the manifest besides the spec."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

import yaml

from nodeagent.converter import ConverterContext, hypervisor_domain_type
from nodeagent.converter.defaults import MEMFD_ANNOTATION
from nodeagent.domxml import render_manifest
from tests.converter.golden import GOLDEN_DIR

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


def test_a_vms_template_annotation_keeps_hugepages_off_memfd() -> None:
    """The VMI's annotations are the template's for a VM (its own metadata is the VM's)."""
    vmi = yaml.safe_load((GOLDEN_DIR / "hugepages-memfd-off.yaml").read_text())
    vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
          "metadata": {"name": "vm", "annotations": {MEMFD_ANNOTATION: "true"}},
          "spec": {"template": {"metadata": vmi["metadata"], "spec": vmi["spec"]}}}
    domain = ET.fromstring(render_manifest(vm, domain_type="test"))
    assert domain.find("memoryBacking/hugepages") is not None
    assert domain.find("memoryBacking/source") is None
    assert domain.find("cpu/numa") is None
