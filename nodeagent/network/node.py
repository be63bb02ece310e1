"""The node's network for real guests: KubeVirt's pod network, bridge and masquerade
bindings, on a host where the agent is not in a pod.

In KubeVirt each VMI's launcher pod has a network namespace of its own, with a bridge, the
guest's tap and a DHCP server for one guest; QEMU runs inside it. Here QEMU is libvirtd's
child in the host's namespace and opens its tap there, so the taps live in the host's
namespace, on one bridge per node that the agent owns (`--bridge`, its subnet
`--pod-subnet`; the gateway is the subnet's first address, on the bridge). Each guest
interface gets a fixed address from the node's dnsmasq (`nodeagent.network.dhcp`); a
masquerade interface's traffic out of the node is NATed to the node's address
(`nodeagent.network.masquerade`), a bridge interface's address is routed as it is (the
guest's "pod IP"). What the agent made is on file (`nodeagent.network.nics`), so a restarted
agent keeps what its running guests use and removes the rest.

Nothing here runs on the test driver, and a real host whose guests have no interfaces needs
none of it: the bridge and dnsmasq are made at the first launch that needs them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from events.api.errors import InvalidSpec
from events.api.vm import INFO_SOURCE_DOMAIN, VirtualMachineInstanceNetworkInterface
from events.runtime.aio import pause_unless_stopped
from nodeagent.converter.context import HostInterface
from nodeagent.defaults import INTERFACES_POLL_SECONDS
from nodeagent.network import links, masquerade
from nodeagent.network.dhcp import Dnsmasq, read_leases
from nodeagent.network.nics import NicTable, derived_mac, pod_interfaces, tap_name

if TYPE_CHECKING:
    from events.api.vm import VirtualMachineInstanceSpec
    from nodeagent.network.nics import GuestNic
    from nodeagent.vmiref import VMIRef

log = structlog.get_logger(__name__)


BRIDGE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,14}")
"""A Linux interface name (at most 15 characters) that is also an nftables table name's and a
file name's part."""


def check_bridge(name: str) -> str:
    if BRIDGE_NAME.fullmatch(name) is None:
        raise InvalidSpec("bridge", f"{name!r} must be 1-15 letters, digits, '_' or '-', "
                                    "starting with a letter")
    return name


def parse_subnet(text: str) -> ipaddress.IPv4Network:
    """An IPv4 network with room for a gateway and guests (`--pod-subnet`)."""
    try:
        subnet = ipaddress.IPv4Network(text)
    except ValueError as e:
        raise InvalidSpec("pod-subnet", f"{text!r} is not an IPv4 network: {e}") from None
    if subnet.prefixlen > 30:
        raise InvalidSpec("pod-subnet", f"{text!r} has no room for a gateway and a guest")
    return subnet


def host_interfaces(uid: str, spec: VirtualMachineInstanceSpec) -> tuple[HostInterface, ...]:
    """The host side of each spec interface, for the converter: the tap the agent makes and
    the MAC (the spec's, else one derived from the uid). Refuses interfaces of any network
    but the pod network, before anything is made."""
    return tuple(
        HostInterface(tap=tap_name(uid, index),
                      mac=spec.domain.devices.interfaces[index].mac_address.lower()
                      or derived_mac(uid, index))
        for index, _, _ in pod_interfaces(spec))


class NodeNetwork:
    def __init__(self, bridge: str, subnet: ipaddress.IPv4Network, directory: str) -> None:
        self.bridge, self.subnet = check_bridge(bridge), subnet
        state = Path(directory, bridge)
        self.table = NicTable(state / "nics.json", subnet)
        self.gateway = ipaddress.IPv4Interface(f"{self.table.gateway}/{subnet.prefixlen}")
        self.dhcp = Dnsmasq(state, bridge, self.gateway)

    def start(self, live: set[str]) -> None:
        """At agent start: keep the interfaces of the VMI instances (uids) whose guests are
        still here; remove every other one's tap, address, lease and NAT."""
        stale = self.table.forget(self.table.uids() - live)
        kept = {nic.tap for nic in self.table.nics}
        orphans = [tap for tap in links.taps_on(self.bridge) if tap not in kept]
        for tap in orphans:
            links.delete(tap)
        if not (stale or orphans or self.table.nics or links.exists(self.bridge)):
            return  # this host never gave a guest a network
        self._sync()
        for nic in stale:
            self.dhcp.release(nic)
        log.info("guest network resumed", bridge=self.bridge, kept=len(self.table.nics),
                 removed=len(stale), orphan_taps=orphans)

    def attach(self, ref: VMIRef, spec: VirtualMachineInstanceSpec) -> list[GuestNic]:
        """The VMI's taps on the bridge, their addresses in dnsmasq and NAT, before its guest
        starts (a second time: the same, as they are)."""
        nics = self.table.assign(ref.uid, ref.namespace, ref.name, spec)
        if not nics:
            return nics
        self._sync()
        for nic in nics:
            links.ensure_tap(nic.tap, self.bridge, ref.uid)
        log.info("guest network attached", vmi=ref.name, namespace=ref.namespace,
                 interfaces=[(nic.interface, nic.tap, nic.mac, nic.ip) for nic in nics])
        return nics

    def detach(self, uid: str) -> None:
        """Remove what `attach` made for VMI instance `uid`; nothing if it made nothing."""
        gone = self.table.forget({uid})
        if not gone:
            return
        for nic in gone:
            links.delete(nic.tap)
        self._sync()
        for nic in gone:
            self.dhcp.release(nic)
        log.info("guest network detached", uid=uid, taps=[nic.tap for nic in gone])

    def _sync(self) -> None:
        """The bridge, dnsmasq and NAT as the table says."""
        links.ensure_bridge(self.bridge, self.gateway)
        self.dhcp.ensure(self.table.nics)
        masquerade.apply(self.bridge, self.subnet,
                         [nic.ip for nic in self.table.nics if nic.masquerade])

    def statuses(self, uid: str) -> list[VirtualMachineInstanceNetworkInterface]:
        """The VMI's `status.interfaces`: name and MAC from the domain as the agent made it,
        the address once the guest holds its DHCP lease."""
        leases = read_leases(self.dhcp.leases)
        out = []
        for nic in self.table.of(uid):
            lease = leases.get(nic.mac)
            ip = nic.ip if lease is not None and lease.ip == nic.ip else ""
            out.append(VirtualMachineInstanceNetworkInterface(
                name=nic.interface, mac=nic.mac, ip_address=ip, ip_addresses=[ip] if ip else [],
                info_source=INFO_SOURCE_DOMAIN))
        return out

    async def watch(self, stop: asyncio.Event, guests: Callable[[], Iterable[VMIRef]],
                    report: Callable[[VMIRef, list[VirtualMachineInstanceNetworkInterface]],
                                     Awaitable[None]]) -> None:
        """Report each guest's interfaces when they change (its lease taken, above all),
        looking every `INTERFACES_POLL_SECONDS`; a restarted agent reports them once again."""
        reported: dict[str, list[VirtualMachineInstanceNetworkInterface]] = {}
        while not stop.is_set():
            here = list(guests())
            for ref in here:
                now = await asyncio.to_thread(self.statuses, ref.uid)
                if now and reported.get(ref.uid) != now:
                    await report(ref, now)
                    reported[ref.uid] = now
            for uid in set(reported) - {ref.uid for ref in here}:
                del reported[uid]
            await pause_unless_stopped(stop, INTERFACES_POLL_SECONDS)
