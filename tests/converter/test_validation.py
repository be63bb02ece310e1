"""Every admission rule refuses a manifest naming the offending field and the rule."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from events.api.errors import InvalidSpec
from events.api.manifest import decode_object
from nodeagent.domxml import render_manifest

BASE: dict[str, Any] = {
    "apiVersion": "kubevirt.io/v1",
    "kind": "VirtualMachineInstance",
    "metadata": {"name": "v"},
    "spec": {
        "domain": {
            "resources": {"requests": {"memory": "64Mi"}},
            "devices": {"disks": [{"name": "root", "disk": {}}]},
        },
        "volumes": [{"name": "root", "containerDisk": {"image": "img"}}],
    },
}

DOMAIN = "spec.domain"


def patched(changes: dict[str, Any]) -> dict[str, Any]:
    """BASE with `a.b.c: value` set (creating objects on the way); None deletes the key."""
    doc = copy.deepcopy(BASE)
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return doc


def disks(*entries: dict[str, Any]) -> dict[str, Any]:
    return {f"{DOMAIN}.devices.disks": list(entries)}


def cpu_features(*entries: dict[str, Any]) -> dict[str, Any]:
    return {f"{DOMAIN}.cpu.features": list(entries)}


def hugepages(memory: str, page_size: str) -> dict[str, Any]:
    return {
        f"{DOMAIN}.resources.requests.memory": memory,
        f"{DOMAIN}.memory.hugepages.pageSize": page_size,
    }


def inputs(*entries: dict[str, Any]) -> dict[str, Any]:
    return {f"{DOMAIN}.devices.inputs": list(entries)}


def named(name: str) -> dict[str, Any]:
    """BASE with its one disk and volume named `name`."""
    return disks({"name": name}) | {
        "spec.volumes": [{"name": name, "persistentVolumeClaim": {"claimName": "c"}}]
    }


PVC_ROOT = {"spec.volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "c"}}]}
METRICS_ROOT = {"spec.volumes": [{"name": "root", "downwardMetrics": {}}]}
SMM_OFF = {f"{DOMAIN}.features.smm.enabled": False}
SECURE_BOOT = {f"{DOMAIN}.firmware.bootloader.efi.secureBoot": True}
PAGE_SIZE = f"{DOMAIN}.memory.hugepages.pageSize"
REQUESTS = f"{DOMAIN}.resources.requests"
LIMITS = f"{DOMAIN}.resources.limits"
HYPERV = f"{DOMAIN}.features.hyperv"
TIMER = f"{DOMAIN}.clock.timer"

CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # hugepages: the seed's three limitations
    ("hugepages-not-preallocatable", hugepages("64Mi", "4Mi"), PAGE_SIZE, "pre-allocate"),
    ("hugepages-bigger", hugepages("64Mi", "1Gi"), PAGE_SIZE, "cannot be bigger than requested"),
    ("hugepages-divisible", hugepages("65Mi", "2Mi"), PAGE_SIZE, "must be divisible by hugepages"),
    ("hugepages-quantity", hugepages("64Mi", "big"), PAGE_SIZE, "must be a quantity"),
    # input devices
    (
        "input-type",
        inputs({"name": "m", "type": "mouse"}),
        f"{DOMAIN}.devices.inputs[0].type",
        "must be one of tablet",
    ),
    (
        "input-bus",
        inputs({"name": "t", "type": "tablet", "bus": "ps2"}),
        f"{DOMAIN}.devices.inputs[0].bus",
        "must be one of virtio, usb",
    ),
    (
        "input-name",
        inputs({"name": "", "type": "tablet"}),
        f"{DOMAIN}.devices.inputs[0].name",
        "must not be empty",
    ),
    (
        "input-duplicate",
        inputs({"name": "t", "type": "tablet"}, {"name": "t", "type": "tablet"}),
        f"{DOMAIN}.devices.inputs[1].name",
        "used twice",
    ),
    # cpu
    (
        "cpu-feature-policy",
        cpu_features({"name": "apic", "policy": "maybe"}),
        f"{DOMAIN}.cpu.features[0].policy",
        "must be one of force, require, optional, disable, forbid",
    ),
    (
        "cpu-feature-name",
        cpu_features({"name": ""}),
        f"{DOMAIN}.cpu.features[0].name",
        "must not be empty",
    ),
    (
        "cpu-feature-duplicate",
        cpu_features({"name": "apic"}, {"name": "apic", "policy": "forbid"}),
        f"{DOMAIN}.cpu.features[1].name",
        "used twice",
    ),
    ("cpu-cores", {f"{DOMAIN}.cpu.cores": -1}, f"{DOMAIN}.cpu.cores", "must not be negative"),
    (
        "cpu-isolate-emulator",
        {f"{DOMAIN}.cpu.isolateEmulatorThread": True},
        f"{DOMAIN}.cpu.isolateEmulatorThread",
        "requires spec.domain.cpu.dedicatedCpuPlacement",
    ),
    # firmware
    (
        "secure-boot-without-smm",
        SECURE_BOOT,
        f"{DOMAIN}.firmware.bootloader.efi.secureBoot",
        "SecureBoot requires SMM",
    ),
    (
        "secure-boot-smm-disabled",
        SECURE_BOOT | SMM_OFF,
        f"{DOMAIN}.firmware.bootloader.efi.secureBoot",
        "SecureBoot requires SMM",
    ),
    (
        "bios-and-efi",
        {f"{DOMAIN}.firmware.bootloader": {"bios": {}, "efi": {}}},
        f"{DOMAIN}.firmware.bootloader",
        "either bios or efi",
    ),
    ("firmware-uuid", {f"{DOMAIN}.firmware.uuid": "nope"}, f"{DOMAIN}.firmware.uuid", "UUID"),
    # resources and memory
    (
        "memory-request-over-limit",
        {f"{LIMITS}.memory": "32Mi"},
        f"{REQUESTS}.memory",
        "less than or equal to spec.domain.resources.limits.memory",
    ),
    (
        "seed-example-cpu-request-over-limit",
        {
            f"{REQUESTS}.memory": "1Gi",
            f"{REQUESTS}.cpu": "2",
            f"{LIMITS}.memory": "2Gi",
            f"{LIMITS}.cpu": "1",
        },
        f"{REQUESTS}.cpu",
        "less than or equal to spec.domain.resources.limits.cpu",
    ),
    (
        "memory-missing",
        {f"{DOMAIN}.resources": None},
        f"{REQUESTS}.memory",
        "must be set, or spec.domain.memory.guest",
    ),
    (
        "guest-over-limit",
        {f"{DOMAIN}.memory.guest": "1Gi", f"{LIMITS}.memory": "512Mi"},
        f"{DOMAIN}.memory.guest",
        "less than or equal to spec.domain.resources.limits.memory",
    ),
    ("guest-zero", {f"{DOMAIN}.memory.guest": 0}, f"{DOMAIN}.memory.guest", "greater than zero"),
    ("request-quantity", {f"{REQUESTS}.cpu": "lots"}, f"{REQUESTS}.cpu", "must be a quantity"),
    # clock
    (
        "clock-utc-and-timezone",
        {f"{DOMAIN}.clock": {"utc": {}, "timezone": "Europe/Paris"}},
        f"{DOMAIN}.clock",
        "either utc or timezone",
    ),
    (
        "pit-tick-policy",
        {f"{TIMER}.pit.tickPolicy": "merge"},
        f"{TIMER}.pit.tickPolicy",
        "must be one of delay, catchup, discard",
    ),
    (
        "rtc-tick-policy",
        {f"{TIMER}.rtc.tickPolicy": "discard"},
        f"{TIMER}.rtc.tickPolicy",
        "must be one of delay, catchup",
    ),
    (
        "hpet-tick-policy",
        {f"{TIMER}.hpet.tickPolicy": "skip"},
        f"{TIMER}.hpet.tickPolicy",
        "must be one of delay, catchup, merge, discard",
    ),
    ("rtc-track", {f"{TIMER}.rtc.track": "host"}, f"{TIMER}.rtc.track", "must be one of guest"),
    # hyperv
    (
        "spinlocks-retries",
        {f"{HYPERV}.spinlocks.spinlocks": 100},
        f"{HYPERV}.spinlocks.spinlocks",
        "at least 4096",
    ),
    (
        "vendorid-length",
        {f"{HYPERV}.vendorid.vendorid": "thirteen-char"},
        f"{HYPERV}.vendorid.vendorid",
        "at most 12 characters",
    ),
    (
        "synic-needs-vpindex",
        {f"{HYPERV}.synic": {}, f"{HYPERV}.vpindex.enabled": False},
        f"{HYPERV}.synic",
        "requires spec.domain.features.hyperv.vpindex, which is disabled",
    ),
    (
        "evmcs-needs-vapic",
        {f"{HYPERV}.evmcs": {}, f"{HYPERV}.vapic.enabled": False},
        f"{HYPERV}.evmcs",
        "requires spec.domain.features.hyperv.vapic",
    ),
    # disks and volumes
    (
        "disk-without-volume",
        disks({"name": "root"}, {"name": "other"}),
        f"{DOMAIN}.devices.disks[1].name",
        "must match the name of a volume",
    ),
    (
        "downward-metrics-volume-without-disk",
        disks() | METRICS_ROOT,
        "spec.volumes[0].name",
        "a DownwardMetrics volume must be used by a disk on the virtio bus",
    ),
    (
        "volume-two-sources",
        {
            "spec.volumes": [
                {"name": "root", "containerDisk": {"image": "i"}, "emptyDisk": {"capacity": "1Gi"}}
            ]
        },
        "spec.volumes[0]",
        "exactly one volume source",
    ),
    (
        "volume-no-source",
        {"spec.volumes": [{"name": "root"}]},
        "spec.volumes[0]",
        "exactly one volume source",
    ),
    (
        "volume-duplicate",
        {"spec.volumes": [{"name": "root", "containerDisk": {"image": "i"}}] * 2},
        "spec.volumes[1].name",
        "used twice",
    ),
    (
        "disk-duplicate",
        disks({"name": "root"}, {"name": "root"}),
        f"{DOMAIN}.devices.disks[1].name",
        "used twice",
    ),
    (
        "disk-and-cdrom",
        disks({"name": "root", "disk": {}, "cdrom": {}}),
        f"{DOMAIN}.devices.disks[0]",
        "only one of disk, cdrom or lun",
    ),
    (
        "disk-and-lun",
        disks({"name": "root", "disk": {}, "lun": {}}),
        f"{DOMAIN}.devices.disks[0]",
        "only one of disk, cdrom or lun",
    ),
    (
        "lun-bus",
        disks({"name": "root", "lun": {"bus": "virtio"}}) | PVC_ROOT,
        f"{DOMAIN}.devices.disks[0].lun.bus",
        "must be one of scsi; got 'virtio'",
    ),
    (
        "lun-on-container-disk",
        disks({"name": "root", "lun": {}}),
        f"{DOMAIN}.devices.disks[0].lun",
        "can only be mapped to a dataVolume or persistentVolumeClaim volume",
    ),
    (
        "lun-seed-spelling",
        disks({"name": "root", "lun": {"reservations": True}}) | PVC_ROOT,
        f"{DOMAIN}.devices.disks[0].lun",
        "unknown field `reservations`",
    ),
    (
        "downward-metrics-on-cdrom",
        disks({"name": "root", "cdrom": {}}) | METRICS_ROOT,
        f"{DOMAIN}.devices.disks[0].disk",
        "DownwardMetrics volume must be used with a disk",
    ),
    (
        "downward-metrics-on-sata",
        disks({"name": "root", "disk": {"bus": "sata"}}) | METRICS_ROOT,
        f"{DOMAIN}.devices.disks[0].disk.bus",
        "must be on the virtio bus",
    ),
    (
        "downward-metrics-and-another-source",
        disks({"name": "root", "disk": {"bus": "virtio"}})
        | {
            "spec.volumes": [
                {"name": "root", "downwardMetrics": {}, "emptyDisk": {"capacity": "1Gi"}}
            ]
        },
        "spec.volumes[0]",
        "exactly one volume source",
    ),
    (
        "downward-metrics-without-bus",
        disks({"name": "root", "disk": {}}) | METRICS_ROOT,
        f"{DOMAIN}.devices.disks[0].disk.bus",
        "not 'sata' (a disk without a bus is on sata)",
    ),
    (
        "disk-bus",
        disks({"name": "root", "disk": {"bus": "ide"}}),
        f"{DOMAIN}.devices.disks[0].disk.bus",
        "must be one of virtio, sata, scsi, usb",
    ),
    (
        "cdrom-bus",
        disks({"name": "root", "cdrom": {"bus": "virtio"}}),
        f"{DOMAIN}.devices.disks[0].cdrom.bus",
        "must be one of sata, scsi, usb",
    ),
    (
        "boot-order-zero",
        disks({"name": "root", "bootOrder": 0}),
        f"{DOMAIN}.devices.disks[0].bootOrder",
        "greater than zero",
    ),
    (
        "empty-disk-capacity",
        {"spec.volumes": [{"name": "root", "emptyDisk": {"capacity": "huge"}}]},
        "spec.volumes[0].emptyDisk.capacity",
        "must be a quantity",
    ),
    (
        "interface-duplicate",
        {f"{DOMAIN}.devices.interfaces": [{"name": "a"}, {"name": "a"}]},
        f"{DOMAIN}.devices.interfaces[1].name",
        "used twice",
    ),
    (
        "grace-period",
        {"spec.terminationGracePeriodSeconds": -1},
        "spec.terminationGracePeriodSeconds",
        "must not be negative",
    ),
    # names: a volume's (and so its disk's) becomes a host file, `<volume>.img`
    (
        "volume-name-traversal",
        named("../../tenant-a/alice-vm/rootdisk"),
        "spec.volumes[0].name",
        "must be a DNS-1123 label",
    ),
    ("volume-name-absolute", named("/etc/passwd"), "spec.volumes[0].name", "DNS-1123 label"),
    ("volume-name-dot-dot", named(".."), "spec.volumes[0].name", "DNS-1123 label"),
    ("volume-name-empty", named(""), "spec.volumes[0].name", "DNS-1123 label"),
    ("volume-name-upper-case", named("Root"), "spec.volumes[0].name", "DNS-1123 label"),
    ("volume-name-underscore", named("root_disk"), "spec.volumes[0].name", "DNS-1123 label"),
    ("volume-name-dot", named("root.disk"), "spec.volumes[0].name", "DNS-1123 label"),
    ("volume-name-leading-dash", named("-root"), "spec.volumes[0].name", "DNS-1123 label"),
    ("volume-name-64", named("a" * 64), "spec.volumes[0].name", "at most 63"),
    (
        "disk-name-traversal",
        disks({"name": "root"}, {"name": "../root"}),
        f"{DOMAIN}.devices.disks[1].name",
        "must be a DNS-1123 label",
    ),
    (
        "interface-name",
        {f"{DOMAIN}.devices.interfaces": [{"name": "bad.name"}]},
        f"{DOMAIN}.devices.interfaces[0].name",
        "can only contain letters, digits, dashes (-) or underscores (_); got 'bad.name'",
    ),
    (
        "interface-name-path",
        {f"{DOMAIN}.devices.interfaces": [{"name": "../eth0"}]},
        f"{DOMAIN}.devices.interfaces[0].name",
        "can only contain",
    ),
    (
        "network-name",
        {"spec.networks": [{"name": "a/b", "pod": {}}]},
        "spec.networks[0].name",
        "can only contain letters, digits, dashes (-) or underscores (_); got 'a/b'",
    ),
    ("network-no-name", {"spec.networks": [{"pod": {}}]}, "spec.networks[0].name", "got None"),
    (
        "network-duplicate",
        {"spec.networks": [{"name": "default", "pod": {}}] * 2},
        "spec.networks[1].name",
        "used twice",
    ),
    # machine type, start strategy, CPU hot-plug (KubeVirt's VMI admission)
    (
        "machine-type-i440fx",
        {f"{DOMAIN}.machine.type": "pc-i440fx-2.10"},
        f"{DOMAIN}.machine.type",
        "must match one of the emulated machines q35*, pc-q35*; got 'pc-i440fx-2.10'",
    ),
    ("machine-type-pc", {f"{DOMAIN}.machine.type": "pc"}, f"{DOMAIN}.machine.type", "got 'pc'"),
    (
        "start-strategy",
        {"spec.startStrategy": "Running"},
        "spec.startStrategy",
        "must be one of Paused; got 'Running'",
    ),
    (
        "start-paused-with-liveness-probe",
        {"spec.startStrategy": "Paused", "spec.livenessProbe": {"tcpSocket": {"port": 22}}},
        "spec.startStrategy",
        "a paused start cannot be combined with spec.livenessProbe",
    ),
    (
        "sockets-above-max-sockets",
        {f"{DOMAIN}.cpu.sockets": 4, f"{DOMAIN}.cpu.maxSockets": 2},
        f"{DOMAIN}.cpu.sockets",
        "must not be greater than spec.domain.cpu.maxSockets (4 > 2)",
    ),
    (
        "sockets-from-cpu-request-above-max-sockets",
        {f"{DOMAIN}.cpu.maxSockets": 2, f"{REQUESTS}.cpu": 3},
        f"{DOMAIN}.cpu.sockets",
        "(3 > 2)",
    ),
    # decoding and the manifest envelope
    ("unknown-field", {f"{DOMAIN}.cpu.corez": 2}, f"{DOMAIN}.cpu", "unknown field `corez`"),
    ("wrong-type", {f"{DOMAIN}.cpu.cores": "two"}, f"{DOMAIN}.cpu.cores", "Expected `int`"),
    ("kind", {"kind": "Pod"}, "kind", "must be one of VirtualMachineInstance, VirtualMachine"),
    ("name", {"metadata.name": None}, "metadata.name", "must be set"),
]


@pytest.mark.parametrize(
    ("changes", "field", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rule_refuses(changes: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        render_manifest(patched(changes))
    assert raised.value.field == field
    assert rule in raised.value.rule


def test_boot_order_reused() -> None:
    doc = patched(
        disks({"name": "root", "bootOrder": 1}, {"name": "data", "bootOrder": 1})
        | {
            "spec.volumes": [
                {"name": n, "containerDisk": {"image": "i"}} for n in ("root", "data")
            ]
        }
    )
    with pytest.raises(InvalidSpec) as raised:
        render_manifest(doc)
    assert raised.value.field == f"{DOMAIN}.devices.disks[1].bootOrder"
    assert "used by another disk" in raised.value.rule


def test_vm_fields_are_under_the_template() -> None:
    vmi = patched({f"{DOMAIN}.cpu.cores": -2})
    vm = {
        "kind": "VirtualMachine",
        "metadata": {"name": "vm"},
        "spec": {"template": {"spec": vmi["spec"]}},
    }
    with pytest.raises(InvalidSpec) as raised:
        render_manifest(vm)
    assert raised.value.field == "spec.template.spec.domain.cpu.cores"


def test_valid_base_renders() -> None:
    assert render_manifest(BASE).startswith('<domain type="kvm">')


def test_lun_and_downward_metrics_are_admitted() -> None:
    """The shapes the new rules refuse elsewhere, written correctly: a lun on a claim (bus
    defaulted to scsi) and a downwardMetrics volume on a plain disk."""
    doc = patched(
        disks(
            {"name": "root", "lun": {"reservation": True}},
            {"name": "metrics", "disk": {"bus": "virtio"}},
        )
        | {
            "spec.volumes": [
                {"name": "root", "dataVolume": {"name": "dv"}},
                {"name": "metrics", "downwardMetrics": {}},
            ],
            f"{DOMAIN}.devices.downwardMetrics": {},
        }
    )
    xml = render_manifest(doc)
    assert '<disk type="block" device="lun">' in xml
    assert '<target dev="sda" bus="scsi" />' in xml
    assert 'name="org.github.vhostmd.1"' in xml


@pytest.mark.parametrize("machine_type", ["q35", "pc-q35-2.10", "pc-q35-rhel9.4.0"])
def test_q35_machine_types_are_admitted(machine_type: str) -> None:
    xml = render_manifest(patched({f"{DOMAIN}.machine.type": machine_type}))
    assert f'machine="{machine_type}"' in xml


def test_names_at_their_limits_are_admitted() -> None:
    """63 characters of DNS-1123 label for a volume and its disk; KubeVirt's wider alphabet
    for an interface and its network."""
    label = "a" + "-0" * 31
    doc = patched(
        named(label)
        | {
            f"{DOMAIN}.devices.interfaces": [{"name": "Eth_0-a", "masquerade": {}}],
            "spec.networks": [{"name": "Eth_0-a", "pod": {}}],
        }
    )
    assert f"/{label}.img" in render_manifest(doc)


def test_the_control_planes_admission_refuses_them_too() -> None:
    """`decode_object`, which admits every applied manifest, runs the same rules: a VM's
    template is refused at its own path."""
    vm = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": "evil", "namespace": "tenant-mallory"},
        "spec": {"template": {"spec": patched(named("../../tenant-a/alice-vm/rootdisk"))["spec"]}},
    }
    with pytest.raises(InvalidSpec) as raised:
        decode_object(vm)
    assert raised.value.field == "spec.template.spec.volumes[0].name"
    assert "must be a DNS-1123 label" in raised.value.rule
