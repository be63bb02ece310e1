"""The node's bridge and the guests' tap devices, through iproute2 (`ip -j` reads JSON).

A tap carries its VMI's uid in its alias (`virtbus <uid>`), so an agent that restarts knows
whose each tap on its bridge is, and which are stale.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Final

import structlog

from nodeagent.network.tools import run

log = structlog.get_logger(__name__)

TAP_ALIAS_PREFIX: Final = "virtbus "
IP_FORWARD: Final = Path("/proc/sys/net/ipv4/ip_forward")


def _links(*selector: str) -> list[dict[str, object]]:
    found: list[dict[str, object]] = json.loads(run("ip", "-j", "-d", "link", "show",
                                                    *selector) or "[]")
    return found


def exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def ensure_bridge(name: str, gateway: ipaddress.IPv4Interface) -> None:
    """The bridge, up, with the gateway's address (the guests' default route); made if it is
    missing, left as it is if it is there. IPv4 forwarding is turned on, as for any router
    (libvirt's NAT networks do the same)."""
    if not exists(name):
        run("ip", "link", "add", name, "type", "bridge")
    run("ip", "addr", "replace", str(gateway), "dev", name)
    run("ip", "link", "set", name, "up")
    if IP_FORWARD.read_text().strip() == "1":
        return
    try:
        IP_FORWARD.write_text("1\n")
    except OSError as e:  # a read-only /proc/sys (a container): the node answers, no further
        log.warning("IPv4 forwarding is off and cannot be turned on: guests reach this node "
                    "only", error=str(e))


def ensure_tap(name: str, bridge: str, uid: str) -> None:
    """A persistent tap device for QEMU to open (libvirt's `managed='no'`), on the bridge, up,
    its alias naming the VMI instance."""
    if not exists(name):
        run("ip", "tuntap", "add", "dev", name, "mode", "tap", "vnet_hdr")
    run("ip", "link", "set", "dev", name, "alias", TAP_ALIAS_PREFIX + uid)
    run("ip", "link", "set", "dev", name, "master", bridge, "up")


def delete(name: str) -> None:
    """Remove a link; one that is gone already is no error."""
    if exists(name):
        run("ip", "link", "del", "dev", name)


def taps_on(bridge: str) -> dict[str, str]:
    """The tap devices on `bridge`, each with the uid its alias names ('' for none)."""
    if not exists(bridge):
        return {}
    taps = {}
    for link in _links("master", bridge):
        info = link.get("linkinfo")
        if isinstance(info, dict) and info.get("info_kind") == "tun":
            alias = str(link.get("ifalias", ""))
            taps[str(link["ifname"])] = alias.removeprefix(TAP_ALIAS_PREFIX) \
                if alias.startswith(TAP_ALIAS_PREFIX) else ""
    return taps
