"""`python -m nodeagent run|fleet|domxml|import-image`: the agent of one host, a fleet of
simulated nodes in one process, the converter on its own, and the host's image store filled."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import msgspec

from events.api.errors import InvalidSpec
from events.api.resources import quantity
from events.jetstream.connect import NATS_FAILURES, Access, add_arguments, stopped_by
from events.language.messages import MigrationAddress
from events.runtime.aio import report_loop_errors
from events.runtime.collector import tune_for_service
from events.runtime.logs import configure
from nodeagent.agent import NodeAgent
from nodeagent.config import AgentConfig
from nodeagent.converter import defaults
from nodeagent.defaults import (
    AGENT_VERSION,
    BRIDGE,
    DEVICE_PLUGIN_CAPACITY,
    HYPERVISOR_PROBE_SECONDS,
    IMAGE_DIR,
    MIGRATION_REPORT_INTERVAL_SECONDS,
    NETWORK_DIR,
    POD_SUBNET,
    REDISCOVERY_INTERVAL_SECONDS,
    SIMULATED_BANDWIDTH_BYTES_PER_SECOND,
    SIMULATED_DIRTY_RATE_BYTES_PER_SECOND,
    TEST_DEFAULT_URI,
    TEST_HOST_CPU_MODEL,
)
from nodeagent.domxml import main_domxml
from nodeagent.fleet import Fleet, FleetConfig
from nodeagent.host import SimulationRefused
from nodeagent.hypervisor import HYPERVISOR_CHOICES
from nodeagent.imagestore import DISK_DIR_IN_IMAGE, ImageStore
from nodeagent.network.node import check_bridge, parse_subnet
from nodeagent.network.tools import NetworkError


def _bytes(text: str) -> int:
    """A Kubernetes quantity (`64Mi`, `1G`) of bytes (or bytes per second), for argparse."""
    try:
        value = int(quantity(text))
    except (ValueError, ArithmeticError):
        raise argparse.ArgumentTypeError(f"not a quantity: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def _link_bandwidth(text: str) -> int:
    """A simulated link's bytes per second: a link that sends nothing never converges."""
    value = _bytes(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be more than 0: {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0: {text!r}")
    return value


def _checked(parse: Callable[[str], object]) -> Callable[[str], object]:
    """`parse` for argparse: its refusal (naming the rule) becomes argparse's message."""
    def checked(text: str) -> object:
        try:
            return parse(text)
        except InvalidSpec as e:
            raise argparse.ArgumentTypeError(e.rule) from None
    return checked


def _migration_address(text: str) -> str:
    """A host name or an IP address, as the migration protocol carries it, for argparse."""
    try:
        return msgspec.convert(text, MigrationAddress)
    except msgspec.ValidationError:
        raise argparse.ArgumentTypeError(f"not a host name or an IP address: {text!r}") \
            from None


def _count(text: str) -> int:
    """A count of at least 1, for argparse."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


class Served(Protocol):
    """An agent or a fleet: it runs until its stop, and says when it has started."""

    started: asyncio.Event

    async def run(self, stop: asyncio.Event) -> None: ...


async def _serve(agent: Served) -> None:
    """The agent (or fleet) until SIGTERM or SIGINT. A signal before it has started (NATS
    may not be answering: its connection retries for ever) cancels the start-up, which holds
    nothing that must be finished; after, it stops the agent in order."""
    stop = asyncio.Event()
    report_loop_errors(asyncio.get_running_loop())
    run = asyncio.ensure_future(agent.run(stop))

    def on_signal() -> None:
        stop.set()
        if not agent.started.is_set():
            run.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, on_signal)
    try:
        await run
    except asyncio.CancelledError:
        if not stop.is_set():
            raise


def _import_image(image_dir: str, reference: str, source: str, path: str) -> int:
    try:
        stored = ImageStore(image_dir).import_file(reference, source, path)
    except (InvalidSpec, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(stored)
    return 0


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`run`: one node's agent."""
    p = sub.add_parser("run", help="run the agent of one node")
    p.add_argument("--node", required=True, help="this node's name")
    add_arguments(p)
    p.add_argument("--libvirt-uri", default=TEST_DEFAULT_URI,
                   help=f"any libvirt URI: {TEST_DEFAULT_URI} simulates a host, "
                        "qemu:///system drives a real one")
    p.add_argument("--sim-state", default="", metavar="FILE",
                   help=f"keep the simulated host ({TEST_DEFAULT_URI}) in FILE, so a restarted "
                        "agent finds its guests")
    p.add_argument("--kvm-devices", type=int, default=DEVICE_PLUGIN_CAPACITY,
                   help="devices.kubevirt.io/kvm this node offers")
    p.add_argument("--tun-devices", type=int, default=DEVICE_PLUGIN_CAPACITY,
                   help="devices.kubevirt.io/tun this node offers")
    p.add_argument("--host-cpu-model", default="",
                   help="CPU model to label a host whose driver names none (default on the "
                        f"test driver: {TEST_HOST_CPU_MODEL})")
    p.add_argument("--disk-dir", default=defaults.DISK_DIR,
                   help="where disk images (containerDisk, PVC, emptyDisk) are resolved")
    p.add_argument("--image-dir", default=IMAGE_DIR,
                   help="the node's image store, where containerDisk and kernelBoot images are")
    p.add_argument("--rediscovery-interval", type=float, default=REDISCOVERY_INTERVAL_SECONDS,
                   help="seconds between host discoveries; reported only on change")
    p.add_argument("--agent-version", default=AGENT_VERSION,
                   help="the version this agent reports; VMIs an older one launched are "
                        "outdated and the workload update strategy moves them")
    p.add_argument("--sim-migration-bandwidth", type=_link_bandwidth,
                   default=SIMULATED_BANDWIDTH_BYTES_PER_SECOND, metavar="QUANTITY",
                   help="bytes per second of the test driver's simulated migration link "
                        "(a migration's own bandwidth limit applies when lower)")
    p.add_argument("--sim-dirty-rate", type=_bytes,
                   default=SIMULATED_DIRTY_RATE_BYTES_PER_SECOND, metavar="QUANTITY",
                   help="bytes per second a simulated guest dirties during a migration, "
                        "unless its VMI's virtbus.io/simulated-dirty-rate annotation says")
    p.add_argument("--migration-report-interval", type=_positive_seconds,
                   default=MIGRATION_REPORT_INTERVAL_SECONDS, metavar="S",
                   help="seconds between a migration's progress reports")
    p.add_argument("--migration-address", type=_migration_address, default="",
                   metavar="HOST",
                   help="where this real host takes migrations in: its libvirtd listens on "
                        "TCP there and QEMU receives the guest there (default: the host name)")
    p.add_argument("--hypervisor", choices=HYPERVISOR_CHOICES, default="auto",
                   help="guests' domain type on a real host: kvm, qemu (TCG), or auto: kvm "
                        "if a probe guest runs under KVM, else qemu")
    p.add_argument("--hypervisor-probe-timeout", type=_positive_seconds,
                   default=HYPERVISOR_PROBE_SECONDS, metavar="S",
                   help="seconds the KVM probe guest has to reach long mode")
    p.add_argument("--bridge", type=_checked(check_bridge), default=BRIDGE,
                   help="real hosts: the bridge the agent puts its guests' taps on")
    p.add_argument("--pod-subnet", type=_checked(parse_subnet), default=POD_SUBNET,
                   metavar="CIDR", help="real hosts: the guests' IPv4 subnet on the bridge "
                                        "(the gateway is its first address)")
    p.add_argument("--network-dir", default=NETWORK_DIR, metavar="DIR",
                   help="real hosts: where the guests' interfaces and dnsmasq's files are kept")


def _add_fleet(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fleet`: many simulated nodes in one process."""
    f = sub.add_parser("fleet", help="run many simulated nodes in one process")
    f.add_argument("--nodes", type=_count, required=True, help="how many nodes")
    f.add_argument("--first", type=_count, default=1,
                   help="the number of the first node (node-<first>, node-<first+1>, ...)")
    add_arguments(f)
    f.add_argument("--state-dir", type=Path, required=True, metavar="DIR",
                   help="where each node's simulated host is kept (DIR/<node>.xml), so a "
                        "restarted fleet finds its guests")
    f.add_argument("--cpu", type=_count, default=0,
                   help="CPUs of each node (default: the test driver's 16)")
    f.add_argument("--memory", type=_bytes, default=0, metavar="QUANTITY",
                   help="memory of each node, a quantity (default: the test driver's 3Gi)")
    f.add_argument("--kvm", type=int, default=DEVICE_PLUGIN_CAPACITY,
                   help="devices.kubevirt.io/kvm each node offers")
    f.add_argument("--tun", type=int, default=DEVICE_PLUGIN_CAPACITY,
                   help="devices.kubevirt.io/tun each node offers")
    f.add_argument("--disk-dir", default=defaults.DISK_DIR,
                   help="where disk images (containerDisk, PVC, emptyDisk) are resolved")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["domxml"]:
        return main_domxml(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m nodeagent")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_fleet(sub)
    sub.add_parser("domxml", help="print the domain XML of a VMI/VM manifest (-f FILE)")
    i = sub.add_parser("import-image", help="put FILE into image REFERENCE in this node's "
                                            "image store")
    i.add_argument("reference", help="the image reference VMIs name, e.g. example.org/os:1")
    i.add_argument("file")
    i.add_argument("--path", default="",
                   help=f"where in the image (default {DISK_DIR_IN_IMAGE}/<FILE's name>: a "
                        "containerDisk's disk; a kernel or initrd where kernelPath / "
                        "initrdPath name it)")
    i.add_argument("--image-dir", default=IMAGE_DIR, help="the node's image store")
    args = parser.parse_args(argv)
    configure()
    if args.command == "import-image":
        return _import_image(args.image_dir, args.reference, args.file, args.path)
    if args.command == "fleet":
        fleet = Fleet(FleetConfig(
            access=Access(args.nats_url, credentials=args.nats_credentials, ca=args.nats_ca,
                          cert=args.nats_cert, key=args.nats_key),
            prefix=args.prefix, nodes=args.nodes, first=args.first,
            state_dir=args.state_dir.absolute(), cpus=args.cpu, memory=args.memory,
            kvm_devices=args.kvm, tun_devices=args.tun, disk_dir=args.disk_dir))
        return _serve_until_stopped(fleet)
    cfg = AgentConfig(node=args.node, nats_url=args.nats_url,
                      nats_credentials=args.nats_credentials, nats_ca=args.nats_ca,
                      nats_cert=args.nats_cert, nats_key=args.nats_key, prefix=args.prefix,
                      libvirt_uri=args.libvirt_uri, kvm_devices=args.kvm_devices,
                      tun_devices=args.tun_devices, host_cpu_model=args.host_cpu_model,
                      disk_dir=args.disk_dir, image_dir=args.image_dir,
                      rediscovery_seconds=args.rediscovery_interval,
                      sim_state=args.sim_state, agent_version=args.agent_version,
                      sim_migration_bandwidth=args.sim_migration_bandwidth,
                      sim_dirty_rate=args.sim_dirty_rate,
                      migration_report_seconds=args.migration_report_interval,
                      migration_address=args.migration_address,
                      hypervisor=args.hypervisor,
                      hypervisor_probe_seconds=args.hypervisor_probe_timeout,
                      bridge=args.bridge, pod_subnet=str(args.pod_subnet),
                      network_dir=args.network_dir)
    try:
        agent = NodeAgent(cfg)
    except (SimulationRefused, NetworkError) as e:
        parser.error(str(e))
    return _serve_until_stopped(agent)


def _serve_until_stopped(agent: Served) -> int:
    tune_for_service()
    try:
        asyncio.run(_serve(agent))
    except NATS_FAILURES as e:  # a malformed URL; NATS lost past what the service rides out
        return stopped_by(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
