"""The host's networking programs, run as a person would run them: iproute2's `ip`, dnsmasq,
`dhcp_release` and `nft`. Each is a maintained Debian package; a missing one is an error that
names the package."""

from __future__ import annotations

import subprocess
from typing import Final

from events.api.errors import VirtbusError

PACKAGES: Final = {"ip": "iproute2", "dnsmasq": "dnsmasq-base", "dhcp_release": "dnsmasq-utils",
                   "nft": "nftables"}


class NetworkError(VirtbusError):
    """The node could not give a guest its network (a program failed or is missing)."""


def run(program: str, *args: str, stdin: str | None = None) -> str:
    """`program args...`'s output; its failure (or its absence) raised as a `NetworkError`."""
    try:
        done = subprocess.run([program, *args], input=stdin, capture_output=True, text=True,
                              check=False)
    except FileNotFoundError:
        raise NetworkError(f"{program} is not installed on this node (Debian: "
                           f"{PACKAGES.get(program, program)})") from None
    if done.returncode != 0:
        raise NetworkError(f"{program} {' '.join(args[:3])} failed: "
                           f"{(done.stderr or done.stdout).strip()}")
    return done.stdout
