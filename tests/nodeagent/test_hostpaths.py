"""A VMI's host files stay in its own directory: `vmi_path` refuses names that are not one
path component and paths that resolve (through `..`, absolute components or symlinks)
outside; the converter makes every file path with it; and the agent, sent a launch that
bypassed admission (as an old or hostile control plane could send it), creates no file
outside the VMI's directory, defines no domain, fails the launch with one log line and a
report, and goes on."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import msgspec
import pytest
from structlog.testing import capture_logs

from events.api.vm import VirtualMachineInstanceSpec
from events.language.messages import NodeReport
from nodeagent import downwardmetrics
from nodeagent.converter import ConverterContext, convert
from nodeagent.hostpaths import HostPathError, vmi_path
from nodeagent.vmiref import VMIRef
from tests.nodeagent.helpers import SPEC, Cluster, next_report, start
from tests.nodeagent.test_work import publish, worked_through

NOT_A_NAME = ["..", ".", "", "../../tenant-a/alice-vm/rootdisk.img", "/etc/passwd.img",
              "sub/root.img", "nul\0.img"]


@pytest.mark.parametrize("entry", NOT_A_NAME)
def test_a_file_name_must_be_one_path_component(tmp_path: Path, entry: str) -> None:
    with pytest.raises(HostPathError, match="is not a file name"):
        vmi_path(str(tmp_path), "ns", "vm", entry)


@pytest.mark.parametrize("component", NOT_A_NAME)
def test_so_must_the_namespace_and_the_name(tmp_path: Path, component: str) -> None:
    with pytest.raises(HostPathError, match="is not a file name"):
        vmi_path(str(tmp_path), component, "vm")
    with pytest.raises(HostPathError, match="is not a file name"):
        vmi_path(str(tmp_path), "ns", component, "root.img")


def test_plain_names_join_as_configured(tmp_path: Path) -> None:
    """The path is returned as joined, not resolved: the operator's base stays in it."""
    base = str(tmp_path / "disks" / ".." / "disks")
    assert vmi_path(base, "ns", "vm") == f"{base}/ns/vm"
    assert vmi_path(base, "ns", "vm", "root.img") == f"{base}/ns/vm/root.img"


def test_a_symlink_out_of_the_vmi_directory_is_refused(tmp_path: Path) -> None:
    own = tmp_path / "disks" / "ns" / "vm"
    own.mkdir(parents=True)
    (tmp_path / "disks" / "ns" / "other").mkdir()
    (own / "outside.img").symlink_to(tmp_path / "victim.img")
    (own / "neighbour.img").symlink_to("../other/root.img")
    (own / "itself.img").symlink_to(".")
    (own / "inside.img").symlink_to("root.img")
    for entry in ("outside.img", "neighbour.img", "itself.img"):
        with pytest.raises(HostPathError, match=r"outside .*the VMI's own directory"):
            vmi_path(str(tmp_path / "disks"), "ns", "vm", entry)
    assert vmi_path(str(tmp_path / "disks"), "ns", "vm", "inside.img") == f"{own}/inside.img"


def test_a_vmi_directory_symlinked_out_of_the_base_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "disks"
    (base / "ns").mkdir(parents=True)
    (base / "ns" / "vm").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HostPathError, match=f"outside {base}"):
        vmi_path(str(base), "ns", "vm", "root.img")


def unadmitted(volume_name: str, source: dict[str, Any]) -> VirtualMachineInstanceSpec:
    """A spec decoded as the agent decodes one, without admission's rules."""
    return msgspec.convert(spec_with(volume_name, source), VirtualMachineInstanceSpec)


def spec_with(volume_name: str, source: dict[str, Any]) -> dict[str, Any]:
    """A disk on virtio, the one bus a downwardMetrics volume may use."""
    disk = {"name": volume_name, "disk": {"bus": "virtio"}}
    return {"domain": {**SPEC["domain"], "devices": {"disks": [disk]}},
            "volumes": [{"name": volume_name, **source}]}


CLAIM: dict[str, Any] = {"persistentVolumeClaim": {"claimName": "c"}}
METRICS: dict[str, Any] = {"downwardMetrics": {}}


@pytest.mark.parametrize("volume_name", ["../../tenant-a/alice-vm/rootdisk", "/etc/evil"])
def test_the_converter_attaches_no_file_outside_the_vmi_directory(
        tmp_path: Path, volume_name: str) -> None:
    """The finding's two manifests: a traversing and an absolute volume name."""
    ctx = ConverterContext(name="evil", namespace="tenant-mallory", domain_type="test",
                           disk_dir=str(tmp_path))
    for source in (CLAIM, METRICS):
        with pytest.raises(HostPathError, match="is not a file name"):
            convert(unadmitted(volume_name, source), ctx)
    with pytest.raises(HostPathError, match="is not a file name"):
        downwardmetrics.disk_paths(unadmitted(volume_name, METRICS), ctx)


@pytest.mark.parametrize(("namespace", "name"), [("..", "vm"), ("ns", ".."), ("a/b", "vm")])
def test_nor_any_directory_of_a_vmi_named_to_leave_its_own(
        tmp_path: Path, namespace: str, name: str) -> None:
    ctx = ConverterContext(name=name, namespace=namespace, domain_type="test",
                           disk_dir=str(tmp_path / "disks"), run_dir=str(tmp_path / "run"))
    with pytest.raises(HostPathError):
        _ = ctx.disk_path
    with pytest.raises(HostPathError):
        _ = ctx.socket_path
    with pytest.raises(HostPathError):
        ctx.disk_file("root.img")


# -- the agent ------------------------------------------------------------------------------


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if not p.is_dir() or p.is_symlink())


class Host:
    """The shared test host's domains, as the test sees them; any the test names in
    `cleanup` are removed after it, should a launch have defined one after all."""

    def __init__(self, conn: libvirt.virConnect) -> None:
        self.conn = conn
        self.cleanup: list[str] = []

    def domains(self) -> list[str]:
        return [d.name() for d in self.conn.listAllDomains(0)]


@pytest.fixture
def host(conn: libvirt.virConnect) -> Iterator[Host]:
    found = Host(conn)
    yield found
    for dom in conn.listAllDomains(0):
        if dom.name() in found.cleanup:
            if dom.isActive():
                dom.destroy()
            dom.undefine()


async def launch_unadmitted(cluster: Cluster, nats_url: str, disk_dir: Path,
                            ref: VMIRef, spec: dict[str, Any]) -> tuple[NodeReport, list[Any]]:
    """Send `spec`'s launch straight to the agent's queue, as the dispatcher would, and
    wait until the agent is done with it: its report on the VMI and its log."""
    reports = await cluster.nc.jetstream().pull_subscribe(
        cluster.layout.reports_filter, stream=cluster.layout.reports_stream)
    with capture_logs() as logs:
        running = await start(cluster, nats_url, disk_dir=str(disk_dir))
        try:
            await worked_through(cluster, running, await publish(cluster,
                                                                 cluster.launch(ref, spec)))
            report = await next_report(
                reports, lambda r: r.domain is not None and r.domain.name == ref.name)
            assert not running.task.done(), "the agent goes on"
        finally:
            await running.close()
    return report, logs


def failed_once(report: NodeReport, logs: list[Any]) -> str:
    """The launch failed as the agent fails any launch: a Failed report and one warning,
    no traceback, nothing rejected; its reason."""
    assert report.domain is not None
    assert (report.domain.phase, report.domain.gone) == ("Failed", False)
    failed = [e for e in logs if e["event"] == "node command failed"]
    assert len(failed) == 1 and "exc_info" not in failed[0]
    assert not [e for e in logs if e["event"] == "node work rejected"]
    assert report.domain.reason.startswith("launch failed: ")
    return report.domain.reason


@pytest.mark.parametrize("volume", [
    ("../../victim/vm/rootdisk", CLAIM),
    ("../../../outside/evil", METRICS),
    ("{outside}/evil", METRICS),
], ids=["traversing-claim", "traversing-metrics", "absolute-metrics"])
async def test_a_launch_naming_a_file_outside_creates_and_defines_nothing(
        cluster: Cluster, nats_url: str, host: Host, tmp_path: Path,
        volume: tuple[str, dict[str, Any]]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    ref = VMIRef(cluster.namespace, "evil", str(uuid.uuid4()))
    host.cleanup.append(ref.domain)
    volume_name, source = volume
    report, logs = await launch_unadmitted(
        cluster, nats_url, tmp_path / "disks", ref,
        spec_with(volume_name.format(outside=outside), source))
    failed_once(report, logs)
    assert ref.domain not in host.domains()
    assert files_under(tmp_path) == []


async def test_a_metrics_disk_symlinked_outside_is_not_written(
        cluster: Cluster, nats_url: str, host: Host, tmp_path: Path) -> None:
    """Admissible names, but the VMI's directory holds a symlink where its metrics disk
    goes: admission cannot see it, the agent's path check does."""
    ref = VMIRef(cluster.namespace, "metrics", str(uuid.uuid4()))
    host.cleanup.append(ref.domain)
    own = tmp_path / "disks" / ref.namespace / ref.name
    own.mkdir(parents=True)
    victim = tmp_path / "victim.img"
    victim.write_bytes(b"precious")
    (own / "metrics.img").symlink_to(victim)
    report, logs = await launch_unadmitted(cluster, nats_url, tmp_path / "disks", ref,
                                           spec_with("metrics", METRICS))
    assert "outside" in (reason := failed_once(report, logs))
    assert "the VMI's own directory" in reason
    assert victim.read_bytes() == b"precious"
    assert ref.domain not in host.domains()
