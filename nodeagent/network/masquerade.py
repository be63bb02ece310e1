"""NAT for masquerading guests (KubeVirt's masquerade binding): their traffic leaves the node
with the node's address. One nftables table per bridge (`ip virtbus-<bridge>`) holds a set of
the masquerading guests' addresses and one rule; it exists only while the set has an
address. Each change replaces the whole table in one nft transaction, so it is idempotent
and never half done.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

from nodeagent.network.tools import NetworkError, run

if TYPE_CHECKING:
    import ipaddress

TABLE_PREFIX: Final = "virtbus-"
SET: Final = "guests"


def table_name(bridge: str) -> str:
    return TABLE_PREFIX + bridge


def apply(bridge: str, subnet: ipaddress.IPv4Network, addresses: list[str]) -> None:
    """Masquerade exactly `addresses` (out of `subnet`); none: the table is removed."""
    table = f"ip {table_name(bridge)}"
    script = [f"add table {table}", f"delete table {table}"]  # gone, whether it was or not
    if addresses:
        elements = f"elements = {{ {', '.join(sorted(addresses))} }}"
        script.append(
            f"table {table} {{\n"
            f"  set {SET} {{ type ipv4_addr; {elements}; }}\n"
            "  chain postrouting {\n"
            "    type nat hook postrouting priority srcnat; policy accept;\n"
            f"    ip saddr @{SET} ip daddr != {subnet} masquerade\n"
            "  }\n"
            "}")
    run("nft", "-f", "-", stdin="\n".join(script) + "\n")


def masqueraded(bridge: str) -> list[str]:
    """The addresses the bridge's table masquerades now ([] when there is no table)."""
    try:
        listing = json.loads(run("nft", "-j", "list", "set", "ip", table_name(bridge), SET))
    except NetworkError:
        return []
    for item in listing.get("nftables", []):
        if "set" in item:
            return sorted(str(e) for e in item["set"].get("elem", []))
    return []
