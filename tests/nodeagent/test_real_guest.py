"""A real guest, booted by a real node agent on `qemu:///system` (libvirtd, QEMU under the
hypervisor the agent's probe chose: TCG on a host whose KVM runs no guest).

The guest (`tests.realhost`) prints the first bytes of its containerDisk (a copy-on-write
overlay on an image imported into the store) and the user-data of its NoCloud ISO on the
serial console. The test reads the serial console log, stops the VMI gracefully (the guest
hears the button: `ShutDown`, not `Destroyed`), and sees every file the agent made for the
guest gone. A missing image fails the launch with its reason and defines nothing.

What it needs (QEMU, libvirt, qemu-img, a kernel, busybox-static) `./dev test` installs; a
host without it fails here with what to install, never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import libvirt
import pytest
from nats.js.api import ConsumerConfig
from nats.js.client import JetStreamContext

from events.language.messages import NodeCommand, NodeReport
from nodeagent.converter import defaults as converter_defaults
from nodeagent.converter.console import SERIAL_LOG
from nodeagent.imagestore import ImageStore
from tests.nodeagent.helpers import Cluster, Running, next_report, start
from tests.nodeagent.test_work import publish, worked_through
from tests.realhost import (
    BOOT_DEADLINE_SECONDS,
    BOOT_IMAGE,
    DISK_IMAGE,
    DISK_MARKER,
    STOP_GRACE_SECONDS,
    URI,
    guest_files,
    guest_spec,
    libvirtd,
)

__all__ = ["guest_files", "libvirtd"]  # fixtures, used by name

SETUP_HOST = Path(__file__).resolve().parents[2] / "deploy" / "realhost" / "setup-host"


@pytest.fixture
async def real_agent(libvirtd: None, guest_files: Path, cluster: Cluster,
                     nats_url: str) -> AsyncIterator[tuple[Running, Path]]:
    host = Path(tempfile.mkdtemp(prefix="virtbus-host-", dir="/var/tmp"))
    host.chmod(0o755)
    store = ImageStore(str(host / "images"))
    store.import_file(DISK_IMAGE, str(guest_files / "disk.raw"))
    store.import_file(BOOT_IMAGE, str(guest_files / "vmlinuz"), "/boot/vmlinuz")
    store.import_file(BOOT_IMAGE, str(guest_files / "initrd.img"), "/boot/initrd.img")
    running = await start(cluster, nats_url, libvirt_uri=URI, disk_dir=str(host / "disks"),
                          image_dir=store.root)
    try:
        yield running, host
    finally:
        await running.close()
        conn = libvirt.open(URI)
        for dom in conn.listAllDomains(0):  # what a failed test left
            if dom.name().startswith(f"{cluster.namespace}_"):
                with contextlib.suppress(libvirt.libvirtError):
                    dom.destroy()
                with contextlib.suppress(libvirt.libvirtError):
                    dom.undefine()
        conn.close()
        shutil.rmtree(host)
        shutil.rmtree(Path(converter_defaults.RUN_DIR, cluster.namespace), ignore_errors=True)


async def _console_line(log: Path, text: str, running: Running) -> str:
    """The serial console's log once it holds `text` (polled until the deadline)."""
    deadline = time.monotonic() + BOOT_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        assert not running.task.done(), "the agent ended"
        content = log.read_text(errors="replace") if log.exists() else ""
        if text in content:
            return content
        await asyncio.sleep(0.1)  # poll interval of the console log
    raise AssertionError(f"no {text!r} on the serial console in {BOOT_DEADLINE_SECONDS} s:\n"
                         + (log.read_text(errors="replace") if log.exists() else "(no log)"))


async def _reports(cluster: Cluster) -> JetStreamContext.PullSubscription:
    """The agent's reports; the consumer outlives the test's waits on the console (an
    ephemeral one idle for 5 s is deleted by the server)."""
    return await cluster.nc.jetstream().pull_subscribe(
        cluster.layout.reports_filter, stream=cluster.layout.reports_stream,
        config=ConsumerConfig(inactive_threshold=3 * BOOT_DEADLINE_SECONDS))


def _domain_report(name: str, phase: str) -> Callable[[NodeReport], bool]:
    return lambda r: r.domain is not None and (r.domain.name, r.domain.phase) == (name, phase)


async def test_a_real_guest_boots_reads_its_disks_and_stops_on_acpi(
        cluster: Cluster, real_agent: tuple[Running, Path]) -> None:
    running, host = real_agent
    reports = await _reports(cluster)
    user_data = f"hello-{uuid.uuid4().hex[:8]}"
    spec = guest_spec(DISK_IMAGE, user_data)
    ref = await cluster.placed("guest", spec)
    await publish(cluster, cluster.launch(ref, spec))
    await next_report(reports, _domain_report(ref.name, "Running"))

    log = Path(converter_defaults.RUN_DIR, ref.namespace, ref.name, SERIAL_LOG)
    console = await _console_line(log, "virtbus-guest: ready", running)
    assert f"virtbus-guest: user-data: {user_data}" in console
    assert f"virtbus-guest: disk: {DISK_MARKER.decode()}" in console
    vmi_dir = host / "disks" / ref.namespace / ref.name
    assert {p.name for p in vmi_dir.iterdir()} >= {"root.qcow2", "cidata.iso", "kernel-boot"}

    stop = NodeCommand(event_id=str(uuid.uuid4()), verb="stop", namespace=ref.namespace,
                       name=ref.name, uid=ref.uid, grace_period_seconds=STOP_GRACE_SECONDS)
    await publish(cluster, stop)
    assert "virtbus-guest: power button" in await _console_line(log, "power button", running)
    stopped = await next_report(reports, _domain_report(ref.name, "Succeeded"))
    assert stopped.domain is not None
    assert (stopped.domain.phase, stopped.domain.reason, stopped.domain.gone) == (
        "Succeeded", "stopped on request (ShutDown)", True)
    assert not vmi_dir.exists(), "the overlay, the ISO and the kernel stay behind"
    assert not log.parent.exists()
    assert Path(ImageStore(str(host / "images")).resolve("image", DISK_IMAGE)).exists()


async def test_a_missing_image_fails_the_launch_and_defines_nothing(
        cluster: Cluster, real_agent: tuple[Running, Path]) -> None:
    running, host = real_agent
    reports = await _reports(cluster)
    spec = guest_spec("virtbus.test/missing:1", "unused")
    ref = await cluster.placed("lost", spec)
    await worked_through(cluster, running, await publish(cluster, cluster.launch(ref, spec)))
    report = await next_report(reports, _domain_report(ref.name, "Failed"))
    assert report.domain is not None
    assert report.domain.reason == (
        "launch failed: spec.volumes[0].containerDisk.image: image 'virtbus.test/missing:1' "
        f"is not in this node's image store ({host / 'images'}); import it: virtbus node "
        "import-image virtbus.test/missing:1 FILE")
    assert ref.domain not in {d.name for d in running.agent.guests.summaries()}
    assert not (host / "disks" / ref.namespace / ref.name).exists()
    assert not os.path.exists(Path(converter_defaults.RUN_DIR, ref.namespace, ref.name))


async def test_a_real_guest_whose_qemu_is_killed_fails_with_the_reason(
        cluster: Cluster, real_agent: tuple[Running, Path]) -> None:
    running, host = real_agent
    reports = await _reports(cluster)
    spec = guest_spec(DISK_IMAGE, "unused")
    ref = await cluster.placed("killed", spec)
    await publish(cluster, cluster.launch(ref, spec))
    await next_report(reports, _domain_report(ref.name, "Running"))
    log = Path(converter_defaults.RUN_DIR, ref.namespace, ref.name, SERIAL_LOG)
    await _console_line(log, "virtbus-guest: ready", running)

    pid = int(Path("/run/libvirt/qemu", f"{ref.domain}.pid").read_text().strip())
    os.kill(pid, signal.SIGKILL)
    failed = await next_report(reports, _domain_report(ref.name, "Failed"))
    assert failed.domain is not None
    assert (failed.domain.reason, failed.domain.gone) == (
        "QEMU ended unexpectedly (killed or failed)", True)
    assert ref.domain not in {d.name for d in running.agent.guests.summaries()}
    assert not (host / "disks" / ref.namespace / ref.name).exists()


def test_setting_up_a_ready_host_again_changes_nothing(libvirtd: None) -> None:
    """`./dev real-host`'s script on a host it made ready (or the fixture did): it installs
    and starts nothing, and says the host answers."""
    done = subprocess.run([str(SETUP_HOST)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "installing" not in done.stderr and "starting" not in done.stderr, done.stderr
    assert f"ready: {URI} answers" in done.stderr
    assert all(Path(d).is_dir() for d in ("/var/lib/virtbus/images", "/var/lib/virtbus/disks",
                                          converter_defaults.RUN_DIR))
