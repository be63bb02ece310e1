"""Which guest interface gets which tap, MAC and address on the node's bridge, kept in a file
so that it outlives the agent (the guests do).

Each interface of the pod network gets a tap named from its VMI's uid (one host network
namespace holds every VMI's taps: KubeVirt's per-pod `tap0` would collide), the MAC its spec
gives or one derived from the uid (QEMU's `52:54:00` prefix), and the lowest free address of
the node's subnet after the gateway: the first guest of a node gets 10.0.2.2, as KubeVirt's
masquerade guest does. A VMI's interfaces keep all three for as long as the VMI runs here.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from events.api.errors import InvalidSpec
from nodeagent.network.tools import NetworkError

if TYPE_CHECKING:
    from events.api.vm import VirtualMachineInstanceSpec

TAP_PREFIX: Final = "tap"
MAC_PREFIX: Final = "52:54:00"
"""QEMU's (and libvirt's) prefix for the MACs it makes up."""


class GuestNic(msgspec.Struct, frozen=True, kw_only=True):
    """One guest interface on the node's bridge."""

    uid: str
    namespace: str
    name: str
    interface: str
    """The spec interface's name (KubeVirt's `status.interfaces[].name`)."""
    tap: str
    mac: str
    ip: str
    masquerade: bool
    """Its traffic out of the node is NATed to the node's address (KubeVirt's masquerade
    binding); a bridge binding's address is routed as it is (the guest's "pod IP")."""


def tap_name(uid: str, index: int) -> str:
    """`tap` + 8 hex digits of the uid's hash + `-<index>`: unique per VMI instance and
    within the 15 characters a Linux interface name may have."""
    return f"{TAP_PREFIX}{hashlib.sha256(uid.encode()).hexdigest()[:8]}-{index}"


def derived_mac(uid: str, index: int) -> str:
    digest = hashlib.sha256(f"{uid}/{index}".encode()).digest()
    return ":".join([MAC_PREFIX, *(f"{b:02x}" for b in digest[:3])])


def pod_interfaces(spec: VirtualMachineInstanceSpec) -> list[tuple[int, str, bool]]:
    """Each spec interface's index, name and whether it masquerades; an interface on another
    network than the pod network (Multus) is refused: a virtbus node has no other."""
    networks = {n.get("name"): n for n in spec.networks}
    found = []
    for index, interface in enumerate(spec.domain.devices.interfaces):
        field = f"spec.domain.devices.interfaces[{index}]"
        network = networks.get(interface.name)
        if network is None:
            raise InvalidSpec(f"{field}.name", f"no network named {interface.name!r} in "
                                               "spec.networks")
        if "pod" not in network:
            position = spec.networks.index(network)
            raise InvalidSpec(f"spec.networks[{position}]", "this node has only the pod "
                                                            "network")
        found.append((index, interface.name, interface.masquerade is not None))
    return found


class NicTable:
    """The node's guest interfaces, kept in `path` (JSON), written before they are used."""

    def __init__(self, path: Path, subnet: ipaddress.IPv4Network) -> None:
        self.path, self.subnet = path, subnet
        self.gateway = next(subnet.hosts())
        try:
            self.nics = msgspec.json.decode(path.read_bytes(), type=list[GuestNic])
        except FileNotFoundError:
            self.nics = []
        except msgspec.DecodeError as e:  # guessing would unplug running guests: refuse
            raise NetworkError(f"{path} is not a list of guest interfaces ({e}); repair or "
                               "remove it (then every guest's tap on the bridge is removed)"
                               ) from None

    def of(self, uid: str) -> list[GuestNic]:
        return [nic for nic in self.nics if nic.uid == uid]

    def uids(self) -> set[str]:
        return {nic.uid for nic in self.nics}

    def assign(self, uid: str, namespace: str, name: str,
               spec: VirtualMachineInstanceSpec) -> list[GuestNic]:
        """The VMI's interfaces: those it has already (a launch done again), or new ones."""
        if existing := self.of(uid):
            return existing
        used_ips = {nic.ip for nic in self.nics}
        used_macs = {nic.mac for nic in self.nics}
        free = (str(a) for a in self.subnet.hosts()
                if a != self.gateway and str(a) not in used_ips)
        nics = []
        for index, interface, masquerade in pod_interfaces(spec):
            given = spec.domain.devices.interfaces[index].mac_address.lower()
            mac = given or derived_mac(uid, index)
            if mac in used_macs:
                raise NetworkError(f"spec.domain.devices.interfaces[{index}].macAddress: {mac} "
                                   "is another guest's on this node")
            ip = next(free, None)
            if ip is None:
                raise NetworkError(f"no free address left in this node's subnet {self.subnet}")
            used_macs.add(mac)
            nics.append(GuestNic(uid=uid, namespace=namespace, name=name, interface=interface,
                                 tap=tap_name(uid, index), mac=mac, ip=ip,
                                 masquerade=masquerade))
        self._save([*self.nics, *nics])
        return nics

    def forget(self, uids: set[str]) -> list[GuestNic]:
        """Drop these VMIs' interfaces; what was dropped."""
        gone = [nic for nic in self.nics if nic.uid in uids]
        if gone:
            self._save([nic for nic in self.nics if nic.uid not in uids])
        return gone

    def _save(self, nics: list[GuestNic]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_bytes(msgspec.json.encode(nics))
        os.replace(temporary, self.path)
        self.nics = nics
