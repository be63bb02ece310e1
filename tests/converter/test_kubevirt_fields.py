"""Fields KubeVirt admits that virtbus once refused as unknown: each is admitted now, each of
KubeVirt's rules for them refuses naming the field and the rule, and what no virtbus node
can give a guest fails the conversion (the launch) naming the field."""

from __future__ import annotations

import pathlib
from typing import Any

import msgspec
import pytest
import yaml

from controlplane.feature_gates import check_feature_gates
from events.api.errors import InvalidSpec
from events.api.manifest import decode_object
from events.api.resources import vmi_resources
from events.api.vm import VirtualMachineInstance
from nodeagent.converter.unavailable import NotOnThisNode
from nodeagent.domxml import main_domxml, render_manifest
from tests.converter.test_validation import DOMAIN, patched

DEVICES = f"{DOMAIN}.devices"
TWO_DISKS = {
    f"{DEVICES}.disks": [{"name": "root", "disk": {}}, {"name": "cfg", "disk": {}}],
}


def with_volume(source: dict[str, Any]) -> dict[str, Any]:
    """BASE plus a second disk whose volume has `source`."""
    return TWO_DISKS | {"spec.volumes": [{"name": "root", "containerDisk": {"image": "img"}},
                                         {"name": "cfg", **source}]}


ADMITTED: list[tuple[str, dict[str, Any]]] = [
    ("kernelBoot", {f"{DOMAIN}.firmware.kernelBoot": {
        "kernelArgs": "console=ttyS0",
        "container": {"image": "k", "kernelPath": "/boot/vmlinuz"}}}),
    ("tpm", {f"{DEVICES}.tpm": {"persistent": True}}),
    ("video", {f"{DEVICES}.video": {"type": "virtio"}}),
    ("gpus", {f"{DEVICES}.gpus": [{"name": "gpu1", "deviceName": "nvidia.com/GP102GL"}]}),
    ("hostDevices", {f"{DEVICES}.hostDevices": [{"name": "hd", "deviceName": "intel.com/qat"}]}),
    ("hostDisk", {"spec.volumes": [{"name": "root", "hostDisk": {
        "path": "/var/lib/images/root.img", "type": "Disk"}}]}),
    ("dra", {f"{DEVICES}.gpus": [{"name": "g", "claimName": "c", "requestName": "r"}],
             "spec.resourceClaims": [{"name": "c", "resourceClaimTemplateName": "t"}]}),
    ("watchdog", {f"{DEVICES}.watchdog": {"name": "w", "i6300esb": {"action": "poweroff"}}}),
    ("sriov", {f"{DEVICES}.interfaces": [{"name": "sriov-net", "sriov": {}}],
               "spec.networks": [{"name": "sriov-net", "multus": {"networkName": "sriov"}}]}),
    ("ports", {f"{DEVICES}.interfaces": [{"name": "default", "masquerade": {},
                                           "ports": [{"name": "http", "port": 80}]}],
               "spec.networks": [{"name": "default", "pod": {}}]}),
    ("ioThreadsPolicy", {f"{DOMAIN}.ioThreadsPolicy": "auto"}),
    ("dedicatedIOThread", {f"{DEVICES}.disks": [{"name": "root", "dedicatedIOThread": True}]}),
    ("maxGuest", {f"{DOMAIN}.memory.maxGuest": "256Mi"}),
    ("chassis", {f"{DOMAIN}.chassis": {"asset": "a-1"}}),
    ("hypervPassthrough", {f"{DOMAIN}.features.hypervPassthrough": {"enabled": True}}),
    ("tlbflush-variants", {f"{DOMAIN}.features.hyperv": {
        "vpindex": {}, "tlbflush": {"direct": {}, "extended": {}}}}),
    ("cpu.numa", {f"{DOMAIN}.cpu": {"dedicatedCpuPlacement": True,
                                    "numa": {"guestMappingPassthrough": {}}},
                  f"{DOMAIN}.memory.hugepages.pageSize": "2Mi"}),
    ("dnsPolicy", {"spec.dnsPolicy": "None",
                   "spec.dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["a.b"],
                                      "options": [{"name": "ndots", "value": "2"}]}}),
    ("topologySpreadConstraints", {"spec.topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
         "whenUnsatisfiable": "DoNotSchedule"}]}),
    ("creationTimestamp-null", {"metadata.creationTimestamp": None}),
    ("secret", with_volume({"secret": {"secretName": "s"}})),
    ("configMap", with_volume({"configMap": {"name": "c"}})),
    ("serviceAccount", with_volume({"serviceAccount": {"serviceAccountName": "default"}})),
    ("sysprep", with_volume({"sysprep": {"secret": {"name": "unattend"}}})),
    ("ephemeral", with_volume({"ephemeral": {"persistentVolumeClaim": {"claimName": "c"}}})),
    ("cloudInitConfigDrive", with_volume({"cloudInitConfigDrive": {"userData": "#cloud"}})),
]

ADMITTED_CHANGES = dict(ADMITTED)


def _doc(changes: dict[str, Any]) -> dict[str, Any]:
    doc = patched({k: v for k, v in changes.items() if v is not None})
    for path, value in changes.items():
        if value is None:  # an explicit null, as `kubectl create --dry-run` writes it
            *parents, last = path.split(".")
            node = doc
            for key in parents:
                node = node[key]
            node[last] = None
    return doc


@pytest.mark.parametrize("changes", [c[1] for c in ADMITTED], ids=[c[0] for c in ADMITTED])
def test_admitted_as_kubevirt_admits_it(changes: dict[str, Any]) -> None:
    obj = decode_object(_doc(changes))
    assert isinstance(obj, VirtualMachineInstance)
    written = msgspec.to_builtins(obj)
    for path, value in changes.items():
        node: Any = written
        for key in path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        assert node == value or (value is None and node is None), path


REFUSED = [
    ("io-threads-policy", {f"{DOMAIN}.ioThreadsPolicy": "dedicated"},
     f"{DOMAIN}.ioThreadsPolicy", "must be one of shared, auto, supplementalPool"),
    ("supplemental-pool-without-count", {f"{DOMAIN}.ioThreadsPolicy": "supplementalPool"},
     f"{DOMAIN}.ioThreads.supplementalPoolThreadCount", "must be set and positive"),
    ("supplemental-pool-zero", {f"{DOMAIN}.ioThreadsPolicy": "supplementalPool",
                                f"{DOMAIN}.ioThreads.supplementalPoolThreadCount": 0},
     f"{DOMAIN}.ioThreads.supplementalPoolThreadCount", "must be set and positive"),
    ("watchdog-diag288", {f"{DEVICES}.watchdog": {"name": "w", "diag288": {}}},
     f"{DEVICES}.watchdog", "amd64 only supports the i6300esb"),
    ("watchdog-action", {f"{DEVICES}.watchdog": {"name": "w", "i6300esb": {"action": "pause"}}},
     f"{DEVICES}.watchdog.i6300esb.action", "must be one of poweroff, reset, shutdown"),
    ("video-type", {f"{DEVICES}.video": {"type": "qxl"}},
     f"{DEVICES}.video.type", "must be one of vga, cirrus, virtio, ramfb, bochs"),
    ("video-headless", {f"{DEVICES}.video": {"type": "vga"},
                        f"{DEVICES}.autoattachGraphicsDevice": False},
     f"{DEVICES}.video", "not allowed when autoattachGraphicsDevice is set to false"),
    ("gpus-two-ramfb", {f"{DEVICES}.gpus": [
        {"name": n, "deviceName": "d", "virtualGPUOptions": {"display": {}}}
        for n in ("a", "b")]},
     f"{DEVICES}.gpus", "multiple displays with ramfb"),
    ("gpu-without-device-name", {f"{DEVICES}.gpus": [{"name": "g"}]},
     f"{DEVICES}.gpus[0].deviceName", "is required"),
    ("host-device-without-device-name", {f"{DEVICES}.hostDevices": [{"name": "h"}]},
     f"{DEVICES}.hostDevices[0].deviceName", "is required"),
    ("kernel-args-without-kernel", {f"{DOMAIN}.firmware.kernelBoot.kernelArgs": "quiet"},
     f"{DOMAIN}.firmware.kernelBoot.kernelArgs", "without an external kernel"),
    ("kernel-boot-no-path", {f"{DOMAIN}.firmware.kernelBoot.container": {"image": "k"}},
     f"{DOMAIN}.firmware.kernelBoot.container", "at least one of kernelPath, initrdPath"),
    ("kernel-boot-no-image", {f"{DOMAIN}.firmware.kernelBoot.container": {
        "image": "", "kernelPath": "/boot/k"}},
     f"{DOMAIN}.firmware.kernelBoot.container.image", "must be set"),
    ("kernel-path-relative", {f"{DOMAIN}.firmware.kernelBoot.container": {
        "image": "k", "kernelPath": "boot/k"}},
     f"{DOMAIN}.firmware.kernelBoot.container.kernelPath", "absolute path"),
    ("initrd-path-dotdot", {f"{DOMAIN}.firmware.kernelBoot.container": {
        "image": "k", "initrdPath": "/boot/../etc/shadow"}},
     f"{DOMAIN}.firmware.kernelBoot.container.initrdPath", "without relative components"),
    ("kernel-path-root", {f"{DOMAIN}.firmware.kernelBoot.container": {
        "image": "k", "kernelPath": "/"}},
     f"{DOMAIN}.firmware.kernelBoot.container.kernelPath", "must not point to root"),
    ("max-guest-below-guest", {f"{DOMAIN}.memory.maxGuest": "32Mi"},
     f"{DOMAIN}.memory.maxGuest", "greater than or equal to"),
    ("numa-without-dedicated-cpus", {f"{DOMAIN}.cpu.numa.guestMappingPassthrough": {},
                                     f"{DOMAIN}.memory.hugepages.pageSize": "2Mi"},
     f"{DOMAIN}.cpu.numa.guestMappingPassthrough", "dedicatedCpuPlacement"),
    ("numa-without-hugepages", {f"{DOMAIN}.cpu": {"dedicatedCpuPlacement": True, "numa": {
        "guestMappingPassthrough": {}}}},
     f"{DOMAIN}.cpu.numa.guestMappingPassthrough", "memory.hugepages"),
    ("hyperv-and-passthrough", {f"{DOMAIN}.features.hyperv": {"relaxed": {}},
                                f"{DOMAIN}.features.hypervPassthrough": {}},
     f"{DOMAIN}.features.hypervPassthrough", "cannot be set together"),
    ("tlbflush-without-vpindex", {f"{DOMAIN}.features.hyperv": {
        "vpindex": {"enabled": False}, "tlbflush": {"direct": {}}}},
     f"{DOMAIN}.features.hyperv.tlbflush", "requires"),
    ("dns-policy", {"spec.dnsPolicy": "Cluster"}, "spec.dnsPolicy",
     "must be one of ClusterFirstWithHostNet, ClusterFirst, Default, None"),
    ("dns-none-without-config", {"spec.dnsPolicy": "None"}, "spec.dnsConfig",
     "must be provided when dnsPolicy is None"),
    ("dns-none-without-nameserver", {"spec.dnsPolicy": "None", "spec.dnsConfig": {}},
     "spec.dnsConfig.nameservers", "at least one DNS nameserver"),
    ("dns-nameserver-not-ip", {"spec.dnsConfig": {"nameservers": ["dns.local"]}},
     "spec.dnsConfig.nameservers[0]", "valid IP address"),
    ("dns-four-nameservers", {"spec.dnsConfig": {"nameservers": ["1.1.1.1"] * 4}},
     "spec.dnsConfig.nameservers", "more than 3"),
    ("dns-seven-searches", {"spec.dnsConfig": {"searches": ["a"] * 7}},
     "spec.dnsConfig.searches", "more than 6"),
    ("dns-search-too-long", {"spec.dnsConfig": {"searches": ["a" * 200, "b" * 60]}},
     "spec.dnsConfig.searches", "256 characters"),
    ("dns-search-not-subdomain", {"spec.dnsConfig": {"searches": ["A_B"]}},
     "spec.dnsConfig.searches[0]", "DNS-1123 subdomain"),
    ("dns-option-no-name", {"spec.dnsConfig": {"options": [{"value": "1"}]}},
     "spec.dnsConfig.options[0].name", "must not be empty"),
    ("port-zero", {f"{DEVICES}.interfaces": [{"name": "default", "masquerade": {},
                                              "ports": [{"port": 0}]}],
                   "spec.networks": [{"name": "default", "pod": {}}]},
     f"{DEVICES}.interfaces[0].ports[0].port", "is required"),
    ("port-out-of-range", {f"{DEVICES}.interfaces": [{"name": "default", "masquerade": {},
                                                      "ports": [{"port": 65536}]}],
                           "spec.networks": [{"name": "default", "pod": {}}]},
     f"{DEVICES}.interfaces[0].ports[0].port", "0 < x < 65536"),
    ("port-protocol", {f"{DEVICES}.interfaces": [{"name": "default", "masquerade": {},
                                                  "ports": [{"port": 53, "protocol": "SCTP"}]}],
                       "spec.networks": [{"name": "default", "pod": {}}]},
     f"{DEVICES}.interfaces[0].ports[0].protocol", "must be one of TCP, UDP"),
    ("port-name-duplicate", {f"{DEVICES}.interfaces": [
        {"name": "default", "masquerade": {},
         "ports": [{"name": "web", "port": 80}, {"name": "web", "port": 8080}]}],
        "spec.networks": [{"name": "default", "pod": {}}]},
     f"{DEVICES}.interfaces[0].ports[1].name", "duplicate name"),
    ("port-name-invalid", {f"{DEVICES}.interfaces": [
        {"name": "default", "masquerade": {}, "ports": [{"name": "Web_1", "port": 80}]}],
        "spec.networks": [{"name": "default", "pod": {}}]},
     f"{DEVICES}.interfaces[0].ports[0].name", "IANA service name"),
    ("two-bindings", {f"{DEVICES}.interfaces": [{"name": "n", "masquerade": {}, "sriov": {}}]},
     f"{DEVICES}.interfaces[0]", "exactly one binding method"),
    ("no-binding", {f"{DEVICES}.interfaces": [{"name": "n"}]},
     f"{DEVICES}.interfaces[0]", "exactly one binding method"),
    ("two-volume-sources", with_volume({"secret": {"secretName": "s"},
                                        "configMap": {"name": "c"}}),
     "spec.volumes[1]", "exactly one volume source"),
    ("secret-without-name", with_volume({"secret": {}}),
     "spec.volumes[1].secret.secretName", "is required"),
    ("config-map-without-name", with_volume({"configMap": {}}),
     "spec.volumes[1].configMap.name", "is required"),
    ("service-account-without-name", with_volume({"serviceAccount": {}}),
     "spec.volumes[1].serviceAccount.serviceAccountName", "is required"),
    ("two-service-accounts", {
        f"{DEVICES}.disks": [{"name": n, "disk": {}} for n in ("root", "sa1", "sa2")],
        "spec.volumes": [{"name": "root", "containerDisk": {"image": "img"}},
                         {"name": "sa1", "serviceAccount": {"serviceAccountName": "a"}},
                         {"name": "sa2", "serviceAccount": {"serviceAccountName": "b"}}]},
     "spec.volumes", "at most one serviceAccount volume"),
]


@pytest.mark.parametrize(("changes", "field", "rule"), [c[1:] for c in REFUSED],
                         ids=[c[0] for c in REFUSED])
def test_kubevirts_rule_refuses(changes: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        decode_object(patched(changes))
    assert raised.value.field == field
    assert rule in raised.value.rule


def test_ports_of_a_non_pod_network_are_not_checked() -> None:
    """KubeVirt checks forwarded ports only on interfaces of the pod network."""
    decode_object(patched({
        f"{DEVICES}.interfaces": [{"name": "net", "bridge": {}, "ports": [{"port": 0}]}],
        "spec.networks": [{"name": "net", "multus": {"networkName": "br"}}]}))


NOT_ON_THIS_NODE = [
    ("sriov", "spec.domain.devices.interfaces[0].sriov", "no SR-IOV virtual function"),
    ("gpus", "spec.domain.devices.gpus[0]", "no 'nvidia.com/GP102GL' device"),
    ("hostDevices", "spec.domain.devices.hostDevices[0]", "no 'intel.com/qat' device"),
    ("cpu.numa", "spec.domain.cpu.numa.guestMappingPassthrough", "does not map host NUMA"),
    ("hostDisk", "spec.volumes[0].hostDisk", "not host path '/var/lib/images/root.img'"),
    ("dra", "spec.domain.devices.gpus[0]", "no 'c' device"),
]


@pytest.mark.parametrize(("case", "field", "why"), NOT_ON_THIS_NODE,
                         ids=[c[0] for c in NOT_ON_THIS_NODE])
def test_what_no_node_has_fails_the_conversion_naming_it(case: str, field: str,
                                                         why: str) -> None:
    changes = ADMITTED_CHANGES[case]
    with pytest.raises(NotOnThisNode) as raised:
        render_manifest(patched(changes))
    assert f"{field}: " in str(raised.value)
    assert why in str(raised.value)


def test_gpus_and_host_devices_ask_the_scheduler_for_their_device_name() -> None:
    doc = patched({f"{DEVICES}.gpus": [{"name": "a", "deviceName": "nvidia.com/T4"},
                                       {"name": "b", "deviceName": "nvidia.com/T4"}],
                   f"{DEVICES}.hostDevices": [{"name": "q", "deviceName": "intel.com/qat"}]})
    vmi = decode_object(doc)
    assert isinstance(vmi, VirtualMachineInstance)
    extended = vmi_resources(vmi.spec.domain).extended
    assert extended["nvidia.com/T4"] == 2
    assert extended["intel.com/qat"] == 1


def test_host_devices_need_their_gate_gpus_do_not() -> None:
    """HostDevices is a KubeVirt feature gate (always on under HCO); GPU is GA."""
    gpu = decode_object(patched(ADMITTED_CHANGES["gpus"]))
    host = decode_object(patched(ADMITTED_CHANGES["hostDevices"]))
    assert isinstance(gpu, VirtualMachineInstance)
    assert isinstance(host, VirtualMachineInstance)
    check_feature_gates(gpu.spec, frozenset(), "spec")
    check_feature_gates(host.spec, frozenset({"HostDevices"}), "spec")
    with pytest.raises(InvalidSpec) as raised:
        check_feature_gates(host.spec, frozenset(), "spec")
    assert raised.value.field == "spec.domain.devices.hostDevices"
    assert raised.value.rule == "the HostDevices feature gate is not enabled"


def test_domxml_says_what_no_node_has(tmp_path: pathlib.Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "gpu.yaml"
    manifest.write_text(yaml.safe_dump(patched(ADMITTED_CHANGES["gpus"])))
    assert main_domxml(["-f", str(manifest)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("error: spec.domain.devices.gpus[0]: this node has no "
                            "'nvidia.com/GP102GL' device to pass through as GPU 'gpu1'\n")
