"""A real guest's files, made with real qemu-img and pycdlib: a containerDisk's overlay on the
store's image, an emptyDisk of its size, NoCloud and ConfigDrive ISOs with KubeVirt's files,
a kernelBoot's kernel and initrd; all removed with the VMI (and only what the agent made);
a missing image makes nothing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pycdlib
import pytest

from events.api.errors import InvalidSpec
from nodeagent import guestdisks
from nodeagent.domxml import parse_manifest
from nodeagent.imagestore import ImageMissing, ImageStore
from tests.realhost import QEMU_IMG, require

UID = "6a1f0000-0000-4000-8000-000000000001"
USER_DATA = "#cloud-config\nruncmd: [echo hello]\n"
NETWORK = "version: 2\nethernets: {eth0: {dhcp4: true}}\n"


@pytest.fixture(autouse=True)
def qemu_img() -> None:
    require(QEMU_IMG, "qemu-utils")


def _vmi(volumes: list[dict[str, Any]], *, name: str = "guest", uid: str = UID,
         firmware: dict[str, Any] | None = None, hostname: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"domain": {"devices": {}, "resources": {"requests": {
        "memory": "64Mi"}}}, "volumes": volumes}
    if firmware:
        spec["domain"]["firmware"] = firmware
    if hostname:
        spec["hostname"] = hostname
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "ns", "uid": uid}, "spec": spec}


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    store = ImageStore(str(tmp_path / "images"))
    raw = tmp_path / "os.raw"
    subprocess.run([QEMU_IMG, "create", "-q", "-f", "raw", str(raw), "1M"], check=True)
    store.import_file("example.org/os:1", str(raw))
    kernel, initrd = tmp_path / "vmlinuz", tmp_path / "initrd.img"
    kernel.write_bytes(b"kernel")
    initrd.write_bytes(b"initrd")
    store.import_file("example.org/kernel:1", str(kernel), "/boot/vmlinuz")
    store.import_file("example.org/kernel:1", str(initrd), "/boot/initrd.img")
    return store


def _prepare(tmp_path: Path, store: ImageStore, vmi: dict[str, Any]) -> Path:
    spec, ctx = parse_manifest(vmi, domain_type="qemu", disk_dir=str(tmp_path / "disks"))
    guestdisks.prepare(spec, msgspec.structs.replace(ctx, run_dir=str(tmp_path / "run")), store)
    return Path(ctx.disk_path)


def _info(path: Path) -> dict[str, Any]:
    out = subprocess.run([QEMU_IMG, "info", "-U", "--output=json", str(path)], check=True,
                         capture_output=True, text=True).stdout
    info: dict[str, Any] = json.loads(out)
    return info


def _iso_files(path: Path) -> dict[str, bytes]:
    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    files = {}
    for directory, _, names in iso.walk(rr_path="/"):
        for name in names:
            rr_path = f"{directory.rstrip('/')}/{name}"
            with iso.open_file_from_iso(rr_path=rr_path) as stream:
                files[rr_path] = stream.read()
    files["volume id"] = iso.pvd.volume_identifier.strip()
    iso.close()
    return files


ALL_VOLUMES = [
    {"name": "root", "containerDisk": {"image": "example.org/os:1"}},
    {"name": "scratch", "emptyDisk": {"capacity": "2Mi"}},
    {"name": "cidata", "cloudInitNoCloud": {"userData": USER_DATA, "networkData": NETWORK}},
    {"name": "drive", "cloudInitConfigDrive": {"userData": USER_DATA}},
]
KERNEL_BOOT = {"kernelBoot": {"container": {"image": "example.org/kernel:1",
                                            "kernelPath": "/boot/vmlinuz",
                                            "initrdPath": "/boot/initrd.img"}}}


def test_every_file_is_made_and_removed_with_the_vmi(tmp_path: Path, store: ImageStore) -> None:
    directory = _prepare(tmp_path, store, _vmi(ALL_VOLUMES, firmware=KERNEL_BOOT))
    overlay = _info(directory / "root.qcow2")
    assert overlay["format"] == "qcow2"
    assert overlay["backing-filename"] == store.resolve("f", "example.org/os:1")
    assert overlay["backing-filename-format"] == "raw"
    scratch = _info(directory / "scratch.qcow2")
    assert (scratch["format"], scratch["virtual-size"]) == ("qcow2", 2 * 1024 * 1024)
    assert (directory / "kernel-boot" / "vmlinuz").read_bytes() == b"kernel"
    assert (directory / "kernel-boot" / "initrd.img").read_bytes() == b"initrd"
    (directory / "claim.img").write_bytes(b"the operator's")  # a PVC's image: not ours

    guestdisks.remove(str(tmp_path / "disks"), str(tmp_path / "run"), "ns", "guest", UID)
    assert sorted(os.listdir(directory)) == ["claim.img"]
    assert not (tmp_path / "run" / "ns" / "guest").exists()
    assert Path(store.resolve("f", "example.org/os:1")).exists()  # the store keeps its image


def test_no_cloud_iso_holds_kubevirts_files(tmp_path: Path, store: ImageStore) -> None:
    directory = _prepare(tmp_path, store, _vmi(ALL_VOLUMES[2:3], name="web.example"))
    files = _iso_files(directory / "cidata.iso")
    assert files["volume id"] == b"cidata"
    assert files["/user-data"] == USER_DATA.encode()
    assert files["/network-config"] == NETWORK.encode()
    assert json.loads(files["/meta-data"]) == {"instance-id": UID, "local-hostname": "web"}


def test_config_drive_iso_holds_kubevirts_files(tmp_path: Path, store: ImageStore) -> None:
    firmware_uuid = "5d307ca9-b3ef-428c-8861-06e72d69f223"
    directory = _prepare(tmp_path, store, _vmi(ALL_VOLUMES[3:], hostname="db",
                                               firmware={"uuid": firmware_uuid}))
    files = _iso_files(directory / "drive.iso")
    assert files["volume id"] == b"config-2"
    assert files["/openstack/latest/user_data"] == USER_DATA.encode()
    assert "/openstack/latest/network_data.json" not in files
    assert files["/openstack/latest/meta_data.json"] == (
        b'{"instance_id":"guest.ns","hostname":"db","uuid":"%s"}' % firmware_uuid.encode())


def test_a_missing_image_makes_nothing(tmp_path: Path, store: ImageStore) -> None:
    volumes = [*ALL_VOLUMES[1:], {"name": "root", "containerDisk": {"image": "no/such:1"}}]
    with pytest.raises(ImageMissing, match=r"spec.volumes\[3\].containerDisk.image: image "
                                           "'no/such:1' is not in this node's image store"):
        _prepare(tmp_path, store, _vmi(volumes))
    assert not (tmp_path / "disks" / "ns" / "guest").exists()


def test_a_missing_kernel_fails_with_its_field(tmp_path: Path, store: ImageStore) -> None:
    firmware = {"kernelBoot": {"container": {"image": "example.org/kernel:1",
                                             "kernelPath": "/boot/nope"}}}
    with pytest.raises(ImageMissing, match=r"kernelBoot.container.kernelPath: image "
                                           "'example.org/kernel:1' has no file '/boot/nope'"):
        _prepare(tmp_path, store, _vmi([], firmware=firmware))


def test_a_hostile_container_path_is_refused(tmp_path: Path, store: ImageStore) -> None:
    volumes = [{"name": "root", "containerDisk": {"image": "example.org/os:1",
                                                  "path": "/../../../../etc/shadow"}}]
    with pytest.raises(InvalidSpec, match="must be a path inside the image") as refused:
        _prepare(tmp_path, store, _vmi(volumes))
    assert refused.value.field == "spec.volumes[0].containerDisk.path"


def test_a_secret_reference_is_refused(tmp_path: Path, store: ImageStore) -> None:
    volumes = [{"name": "cidata", "cloudInitNoCloud": {"secretRef": {"name": "s"}}}]
    with pytest.raises(InvalidSpec, match="needs a Secret"):
        _prepare(tmp_path, store, _vmi(volumes))


def test_a_redelivered_launch_keeps_the_running_guests_files(tmp_path: Path,
                                                             store: ImageStore) -> None:
    directory = _prepare(tmp_path, store, _vmi(ALL_VOLUMES[:1]))
    before = (directory / "root.qcow2").stat().st_ino
    _prepare(tmp_path, store, _vmi(ALL_VOLUMES[:1]))
    assert (directory / "root.qcow2").stat().st_ino == before


def test_another_instances_removal_leaves_the_files(tmp_path: Path, store: ImageStore) -> None:
    """A stop of a former instance of the name (another uid) must not take the new one's."""
    directory = _prepare(tmp_path, store, _vmi(ALL_VOLUMES[:1]))
    guestdisks.remove(str(tmp_path / "disks"), str(tmp_path / "run"), "ns", "guest", "older")
    assert (directory / "root.qcow2").exists()
    new_uid = "6a1f0000-0000-4000-8000-000000000002"
    _prepare(tmp_path, store, _vmi(ALL_VOLUMES[:1], uid=new_uid))  # replaces the old files
    assert _info(directory / "root.qcow2")["format"] == "qcow2"
    guestdisks.remove(str(tmp_path / "disks"), str(tmp_path / "run"), "ns", "guest", new_uid)
    assert not directory.exists()
