"""What the context takes from the manifest besides the spec (the domain type is
`nodeagent.hypervisor`'s, tested in tests/nodeagent/test_hypervisor.py)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import yaml

from nodeagent.converter import ConverterContext
from nodeagent.converter.defaults import MEMFD_ANNOTATION
from nodeagent.domxml import render_manifest
from tests.converter.golden import GOLDEN_DIR


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
