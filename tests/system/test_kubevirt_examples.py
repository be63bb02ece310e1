"""KubeVirt's own `examples/` (vendored under tests/fixtures/kubevirt-examples) on a live
system: each file gets KubeVirt's verdict, and each VMI the system creates from an accepted
one becomes the domain KubeVirt's converter gives, for the parts the seeds cover.

The verdicts are KubeVirt's at the vendored commit under the HyperConverged's default
feature gates (the seed's cluster): its VM webhook applies a VM's instancetype before it
admits the VM, and the generated instancetype examples set `memory.guest` in the template as
well, so KubeVirt refuses them for the conflict; the examples that need a gate the
HyperConverged leaves off are refused naming the gate. Each refused instancetype example is
then applied as a user fixes it (the conflicting `memory.guest` taken out), so instancetypes
and preferences are rendered too.
"""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Final

import yaml

from controlplane.user.client import Client
from nodeagent.converter import convert
from nodeagent.converter.unavailable import NotOnThisNode
from nodeagent.domxml import parse_manifest
from tests.system.harness import System, eventually

KUBEVIRT_EXAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "kubevirt-examples"
CONFLICT: Final = ("spec.template.spec.domain.memory.guest",
                   "VM field(s) spec.template.spec.domain.memory.guest conflicts with selected "
                   "instance type")


def gate(name: str, field: str) -> tuple[str, str]:
    return field, f"the {name} feature gate is not enabled"


SIDECAR_ANNOTATION: Final = "annotations.hooks.kubevirt.io/hookSidecars"
REFUSED: Final[dict[str, tuple[str, str]]] = {
    "vm-cirros-clarge-virtio": CONFLICT,
    "vm-cirros-clarge-windows": CONFLICT,
    "vm-cirros-clarge": CONFLICT,
    "vm-cirros-cluster-csmall": CONFLICT,
    "vm-cirros-csmall": CONFLICT,
    "vm-windows-clarge-windows": CONFLICT,
    "vm-cirros-with-sidecar-hook-configmap": gate(
        "Sidecar", f"spec.template.metadata.{SIDECAR_ANNOTATION}"),
    "vmi-with-sidecar-hook": gate("Sidecar", f"metadata.{SIDECAR_ANNOTATION}"),
    "vmi-with-sidecar-hook-configmap": gate("Sidecar", f"metadata.{SIDECAR_ANNOTATION}"),
    "vmi-host-disk": gate("HostDisk", "spec.volumes[0].hostDisk"),
}
"""Example (file stem) -> (field, rule) of its refusal; every other example is accepted."""

NOT_ON_THIS_NODE: Final = {
    "vmi-gpu": "spec.domain.devices.gpus[0]: this node has no 'nvidia.com/GP102GL_Tesla_P40' "
               "device to pass through as GPU 'gpu1'",
    "vmi-sriov": "spec.domain.devices.interfaces[1].sriov: this node has no SR-IOV virtual "
                 "function for interface 'sriov-net'",
    "vmi-usb": "spec.domain.devices.hostDevices[0]: this node has no 'kubevirt.io/storage' "
               "device to pass through as 'node-usb-to-vmi-storage'",
    "vmi-dra-pgpu": "spec.domain.devices.gpus[0]: this node has no 'pgpu-resource-claim' device "
                    "to pass through as GPU 'example-gpu'",
}
"""Accepted, as KubeVirt accepts them, but no virtbus node has the device: the launch fails
naming it (KubeVirt's VMI would stay unschedulable for want of the resource)."""

MI = 1024 * 1024
GUEST_AGENT = "org.qemu.guest_agent.0"
PLAIN: Final[dict[str, Any]] = {
    "machine": "q35", "firmware": "bios", "kernel": False, "memory": 128 * MI, "vcpus": 1,
    "topology": (1, 1, 1), "features": ["acpi", "vmport"], "hyperv": [],
    "interfaces": [("default", "virtio")],
    "usb": "none", "channels": [GUEST_AGENT], "rng": False, "tpm": False,
}
"""What KubeVirt gives every domain these examples ask nothing else of: q35, BIOS, ACPI
always, one vCPU as sockets/cores/threads 1/1/1, the pod interface its webhook adds, no USB
controller, the guest agent channel."""
FEDORA: Final = {"memory": 1024000000, "rng": True}
CIRROS_DISKS: Final = [("containerdisk", "virtio"), ("cloudinitdisk", "virtio")]
FEDORA_DISKS: Final = CIRROS_DISKS
WINDOWS_PREFERENCE: Final = {
    "firmware": "efi-secure", "features": ["acpi", "apic", "hyperv", "smm", "vmport"],
    "hyperv": [("relaxed", None), ("vapic", None), ("spinlocks", "8191")], "tpm": True,
}
"""The `windows` preference: EFI with Secure Boot (so SMM), APIC, Hyper-V relaxed, vapic and
8191 spinlock retries, and a TPM."""
CLARGE: Final = {"memory": 2048 * MI, "vcpus": 4, "topology": (4, 1, 1)}
"""The `clarge` instancetype: 4 vCPUs (as sockets, KubeVirt's default topology), 2Gi."""

DOMAINS: Final[dict[str, dict[str, Any]]] = {
    "vm-alpine-datavolume": {"disks": [("datavolumedisk1", "virtio")]},
    "vm-alpine-multipvc": {"disks": [("pvcdisk1", "virtio"), ("pvcdisk2", "virtio")]},
    "vm-cirros-sata": {"disks": [("containerdisk", "sata"), ("cloudinitdisk", "sata")]},
    "vm-cirros": {"disks": CIRROS_DISKS},
    "vm-priorityclass": {"disks": CIRROS_DISKS},
    "vmi-alpine-efi": {"firmware": "efi", "memory": 1024 * MI,
                       "disks": [("containerdisk", "virtio")]},
    "vmi-arm": {"memory": 256 * MI, "disks": [*CIRROS_DISKS, ("emptydisk", "virtio")]},
    "vmi-ephemeral": {"disks": [("containerdisk", "virtio")]},
    "vmi-fedora": {**FEDORA, "disks": FEDORA_DISKS, "interfaces": [("default", "virtio")]},
    "vmi-fedora-isolated": {**FEDORA, "disks": FEDORA_DISKS},
    "vmi-kernel-boot": {"kernel": True, "memory": 1024 * MI, "disks": []},
    "vmi-masquerade": {**FEDORA, "disks": FEDORA_DISKS,
                       "interfaces": [("testmasquerade", "virtio")]},
    "vmi-migratable": {"disks": [("containerdisk", "virtio")],
                       "interfaces": [("default", "virtio")]},
    "vmi-multus-multiple-net": {**FEDORA, "disks": FEDORA_DISKS,
                                "interfaces": [("default", "virtio"), ("ptp", "virtio")]},
    "vmi-multus-ptp": {**FEDORA, "disks": FEDORA_DISKS, "interfaces": [("ptp", "virtio")]},
    "vmi-nocloud": {"disks": [*CIRROS_DISKS, ("emptydisk", "virtio")]},
    "vmi-pvc": {"disks": [("pvcdisk", "virtio")]},
    "vmi-sata": {"disks": [("containerdisk", "sata")]},
    "vmi-secureboot": {"firmware": "efi-secure", "memory": 1024 * MI,
                       "features": ["acpi", "smm", "vmport"],
                       "disks": [("containerdisk", "virtio")]},
    "vmi-windows": {**WINDOWS_PREFERENCE, "memory": 2048 * MI, "vcpus": 2,
                    "topology": (1, 2, 1), "disks": [("pvcdisk", "sata")],
                    "interfaces": [("default", "e1000")]},
    # The refused instancetype examples, fixed: `disk: {}` is sata unless a preference says.
    "vm-cirros-csmall": {"disks": [("containerdisk", "sata"), ("cloudinitdisk", "virtio")]},
    "vm-cirros-cluster-csmall": {"disks": [("containerdisk", "sata"),
                                           ("cloudinitdisk", "virtio")]},
    "vm-cirros-clarge": {**CLARGE, "disks": [("containerdisk", "sata"),
                                             ("cloudinitdisk", "virtio")]},
    "vm-cirros-clarge-virtio": {**CLARGE, "disks": CIRROS_DISKS},
    "vm-cirros-clarge-windows": {**CLARGE, **WINDOWS_PREFERENCE,
                                 "disks": [("containerdisk", "sata"), ("cloudinitdisk", "sata")]},
    "vm-windows-clarge-windows": {**CLARGE, **WINDOWS_PREFERENCE,
                                  "disks": [("pvcdisk", "sata")]},
}
"""Example (file stem) -> what the domain of its VMI has beyond PLAIN."""

KIND_ORDER: Final = ("VirtualMachineInstancetype", "VirtualMachineClusterInstancetype",
                     "VirtualMachinePreference")
"""Applied first, so the VMs that name them find them (as KubeVirt's webhook must)."""


def examples() -> list[tuple[str, dict[str, Any]]]:
    """(stem, document) of every vendored example, instancetypes and preferences first."""
    found = [(path.stem, yaml.safe_load(path.read_text()))
             for path in sorted(KUBEVIRT_EXAMPLES.glob("*.yaml"))]
    return sorted(found, key=lambda item: (item[1]["kind"] not in KIND_ORDER, item[0]))


def placed(stem: str, doc: dict[str, Any]) -> dict[str, Any]:
    """A VMI example in a namespace of its own: two of them are both named vmi-fedora."""
    if doc["kind"] != "VirtualMachineInstance":
        return doc
    return {**doc, "metadata": {**doc["metadata"], "namespace": stem}}


def fixed(doc: dict[str, Any]) -> dict[str, Any]:
    """The VM as a user fixes KubeVirt's refusal: the template's `memory.guest` left to the
    instancetype."""
    vm = copy.deepcopy(doc)
    del vm["spec"]["template"]["spec"]["domain"]["memory"]
    return vm


def summary(xml: str) -> dict[str, Any]:
    """The parts of a domain the seeds decide, in the terms of DOMAINS."""
    root = ET.fromstring(xml)
    loader = root.find("os/loader")
    topology = root.find("cpu/topology")
    usb = root.find("devices/controller[@type='usb']")
    return {
        "machine": _found(root, "os/type").get("machine"),
        "firmware": "bios" if loader is None
        else "efi-secure" if loader.get("secure") == "yes" else "efi",
        "kernel": root.find("os/kernel") is not None,
        "memory": int(root.findtext("memory", "")),
        "vcpus": int(root.findtext("vcpu", "")),
        "topology": None if topology is None
        else tuple(int(topology.get(axis, "")) for axis in ("sockets", "cores", "threads")),
        "features": [feature.tag for feature in root.iterfind("features/*")],
        "hyperv": [(feature.tag, feature.get("retries"))
                   for feature in root.iterfind("features/hyperv/*")],
        "disks": [(_alias(disk), _found(disk, "target").get("bus"))
                  for disk in root.iterfind("devices/disk")],
        "interfaces": [(_alias(iface), _found(iface, "model").get("type"))
                       for iface in root.iterfind("devices/interface")],
        "usb": None if usb is None else usb.get("model"),
        "channels": [_found(channel, "target").get("name")
                     for channel in root.iterfind("devices/channel")],
        "rng": root.find("devices/rng") is not None,
        "tpm": root.find("devices/tpm") is not None,
    }


def _found(element: ET.Element, path: str) -> ET.Element:
    found = element.find(path)
    assert found is not None, f"no {path} in {element.tag}"
    return found


def _alias(device: ET.Element) -> str:
    return _found(device, "alias").get("name", "").removeprefix("ua-")


def domain_of(vmi: dict[str, Any]) -> dict[str, Any]:
    """What the agent defines for the VMI (its launch: `parse_manifest` then `convert`)."""
    return summary(convert(*parse_manifest(vmi, domain_type="test")))


async def vmi_of(vb: Client, namespace: str, name: str) -> dict[str, Any]:
    async def created() -> dict[str, Any] | None:
        found = await vb.query("VirtualMachineInstance", namespace, name)
        return found[0] if found else None
    return await eventually(created, what=f"VMI {namespace}/{name}")


async def test_every_kubevirt_example_gets_kubevirts_verdict_and_domain(
        system: System, vb: Client) -> None:
    verdicts: dict[str, tuple[str, str] | None] = {}
    accepted: list[tuple[str, str, str]] = []
    """(stem, namespace, name) of the VMIs to render."""
    documents = dict(examples())
    for stem, doc in examples():
        [outcome] = await vb.apply(placed(stem, doc), check=False)
        verdicts[stem] = None if outcome.accepted else (outcome.field, outcome.reason)
        if outcome.accepted and doc["kind"] in ("VirtualMachine", "VirtualMachineInstance"):
            accepted.append((stem, placed(stem, doc)["metadata"].get("namespace", "default"),
                             doc["metadata"]["name"]))
    assert verdicts == {stem: REFUSED.get(stem) for stem in documents}

    for stem, refusal in REFUSED.items():
        if refusal is CONFLICT:
            [outcome] = await vb.apply(fixed(documents[stem]), check=False)
            assert outcome.accepted, (stem, outcome.reason)
            accepted.append((stem, "default", documents[stem]["metadata"]["name"]))
    for stem, namespace, name in accepted:
        if documents[stem]["kind"] == "VirtualMachine":
            assert (await vb.act("VirtualMachine", "start", namespace, name)).accepted, name

    rendered: dict[str, dict[str, Any]] = {}
    for stem, namespace, name in accepted:
        vmi = await vmi_of(vb, namespace, name)
        if stem in NOT_ON_THIS_NODE:
            try:
                domain_of(vmi)
            except NotOnThisNode as refused:
                assert str(refused) == NOT_ON_THIS_NODE[stem]
            else:
                raise AssertionError(f"{stem} rendered without its device")
            continue
        rendered[stem] = domain_of(vmi)
    assert sorted(rendered) == sorted(DOMAINS)
    for stem, parts in DOMAINS.items():
        assert (stem, rendered[stem]) == (stem, {**PLAIN, **parts})
