"""The files a real guest boots from, made before its domain is defined and removed with it.

| volume / firmware              | made                                                  |
|--------------------------------|-------------------------------------------------------|
| containerDisk                  | `<volume>.qcow2`, a copy-on-write overlay on the      |
|                                | store's image (`qemu-img create -b`)                  |
| emptyDisk                      | `<volume>.qcow2`, an empty qcow2 of `capacity`        |
| cloudInitNoCloud / ConfigDrive | `<volume>.iso` (`nodeagent.cloudinit`)                |
| kernelBoot.container           | `kernel-boot/<basename>`, copied out of the image     |

Paths are the converter's (`volume_source`, `kernel_artifacts`), so the domain names what is
made, each confined to the VMI's directory (`nodeagent.hostpaths`). Every image is resolved
before anything is made: a missing one fails the launch with its reason and leaves nothing.
What is made is listed first in `MADE_RECORD` in the VMI's directory, with the VMI's uid,
so it is removed with the VMI even by an agent restarted meanwhile, and only what the agent
made (a persistentVolumeClaim's image beside it is the operator's). A launch of a VMI whose
files are there already (a redelivered launch of a running guest) makes nothing again.
qemu-img (qemu-utils) does the images, as KubeVirt's virt-launcher does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec
import structlog

from events.api.errors import VirtbusError
from events.api.resources import quantity
from nodeagent import cloudinit
from nodeagent.converter.disks import volume_source
from nodeagent.converter.kernelboot import kernel_artifacts
from nodeagent.hostpaths import vmi_path

if TYPE_CHECKING:
    from events.api.vm import VirtualMachineInstanceSpec
    from nodeagent.converter import ConverterContext
    from nodeagent.imagestore import ImageStore

log = structlog.get_logger(__name__)

MADE_RECORD: Final = ".virtbus-made.json"
QEMU_IMG: Final = "qemu-img"


class GuestDiskError(VirtbusError):
    """An image could not be made (qemu-img failed or is missing)."""


class Made(msgspec.Struct):
    """The record of what the agent made for one VMI instance."""

    uid: str
    files: list[str]
    """Paths relative to the VMI's directory."""


def _qemu_img(*args: str) -> str:
    try:
        done = subprocess.run([QEMU_IMG, *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise GuestDiskError("qemu-img is not installed on this node (Debian: qemu-utils)") \
            from None
    if done.returncode != 0:
        raise GuestDiskError(f"qemu-img {args[0]} failed: {done.stderr.strip()}")
    return done.stdout


def overlay(backing: str, path: str) -> None:
    """A qcow2 over `backing` (its format as qemu-img finds it): the guest's writes stay in
    `path`, the store's image is never written."""
    backing_format = json.loads(_qemu_img("info", "--output=json", backing))["format"]
    _qemu_img("create", "-q", "-f", "qcow2", "-F", backing_format, "-b", backing, path)


def empty_disk(size_bytes: int, path: str) -> None:
    _qemu_img("create", "-q", "-f", "qcow2", path, str(size_bytes))


def _write(content: bytes) -> Callable[[str], object]:
    def write(path: str) -> None:
        Path(path).write_bytes(content)
    return write


def _plan(spec: VirtualMachineInstanceSpec, ctx: ConverterContext, store: ImageStore
          ) -> dict[str, Callable[[str], object]]:
    """Each file to make (its path) and how: every image resolved and every cloud-init
    source read first, so a missing image or a bad source makes nothing."""
    plan: dict[str, Callable[[str], object]] = {}
    host = cloudinit.hostname(spec, ctx.name)
    instance_uuid = (spec.domain.firmware.uuid if spec.domain.firmware else "") or ctx.uid
    for index, volume in enumerate(spec.volumes):
        field = f"spec.volumes[{index}]"
        path = volume_source(ctx, volume).path
        if volume.container_disk is not None:
            disk = volume.container_disk
            backing = store.resolve(f"{field}.containerDisk.image", disk.image, disk.path,
                                    f"{field}.containerDisk.path")
            plan[path] = functools.partial(overlay, backing)
        elif volume.empty_disk is not None:
            size = int(quantity(volume.empty_disk.capacity))
            plan[path] = functools.partial(empty_disk, size)
        elif volume.cloud_init_no_cloud is not None:
            plan[path] = _write(cloudinit.no_cloud_iso(
                f"{field}.cloudInitNoCloud", volume.cloud_init_no_cloud,
                instance_id=instance_uuid, host=host))
        elif volume.cloud_init_config_drive is not None:
            plan[path] = _write(cloudinit.config_drive_iso(
                f"{field}.cloudInitConfigDrive", volume.cloud_init_config_drive,
                name=ctx.name, namespace=ctx.namespace, uuid=instance_uuid, host=host))
    firmware = spec.domain.firmware
    kernel_boot = firmware.kernel_boot if firmware is not None else None
    if kernel_boot is not None and kernel_boot.container is not None:
        image = kernel_boot.container.image
        for artifact in kernel_artifacts(spec, ctx):
            source = store.resolve("spec.domain.firmware.kernelBoot.container.image", image,
                                   artifact.path_in_image, artifact.field)
            plan[artifact.host_path] = functools.partial(shutil.copyfile, source)
    return plan


def _record_path(ctx: ConverterContext) -> str:
    return ctx.disk_file(MADE_RECORD)


def _read_record(path: str) -> Made | None:
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=Made)
    except FileNotFoundError:
        return None
    except msgspec.DecodeError as e:
        log.warning("unreadable record of made files; nothing removed by it", path=path,
                    error=str(e))
        return None


def prepare(spec: VirtualMachineInstanceSpec, ctx: ConverterContext, store: ImageStore,
            guest_owner: tuple[int, int] | None = None) -> None:
    """Make the VMI's files (above) and its socket directory, owned by `guest_owner` (the
    uid and gid QEMU runs as, which binds the sockets); on any failure remove what was made
    and raise."""
    record = _record_path(ctx)
    found = _read_record(record)
    if found is not None and found.uid == ctx.uid:
        return  # made for this VMI already: its guest may be running on them
    if found is not None:
        remove(ctx.disk_dir, ctx.run_dir, ctx.namespace, ctx.name, found.uid)  # a former one's
    plan = _plan(spec, ctx, store)
    Path(ctx.socket_path).mkdir(parents=True, exist_ok=True, mode=0o755)
    if guest_owner is not None:
        os.chown(ctx.socket_path, *guest_owner)
    directory = ctx.disk_path
    Path(directory).mkdir(parents=True, exist_ok=True, mode=0o755)
    made = Made(uid=ctx.uid, files=[os.path.relpath(path, directory) for path in plan])
    Path(record).write_bytes(msgspec.json.encode(made))
    try:
        for path, make in plan.items():
            Path(path).parent.mkdir(exist_ok=True, mode=0o755)
            Path(path).unlink(missing_ok=True)
            make(path)
    except BaseException:
        remove(ctx.disk_dir, ctx.run_dir, ctx.namespace, ctx.name, ctx.uid)
        raise
    log.info("guest files made", vmi=ctx.name, namespace=ctx.namespace, files=made.files)


def remove(disk_dir: str, run_dir: str, namespace: str, name: str, uid: str) -> None:
    """Remove what the agent made for VMI instance `uid` (another instance's record is left
    alone), the VMI's disk directory if nothing else is in it, and its run directory."""
    record = vmi_path(disk_dir, namespace, name, MADE_RECORD)
    found = _read_record(record)
    if found is None or found.uid != uid:
        return
    directory = vmi_path(disk_dir, namespace, name)
    for relative in found.files:
        path = vmi_path(disk_dir, namespace, name, *Path(relative).parts)
        Path(path).unlink(missing_ok=True)
        if os.path.dirname(path) != directory:
            with contextlib.suppress(OSError):  # not empty: not only ours
                os.rmdir(os.path.dirname(path))
    Path(record).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: not only ours
        os.rmdir(directory)
    # The run directory holds only what the domain's QEMU and virtlogd made: its sockets
    # (which QEMU leaves behind) and the serial console log.
    shutil.rmtree(vmi_path(run_dir, namespace, name), ignore_errors=True)
    log.info("guest files removed", vmi=name, namespace=namespace, files=found.files)
