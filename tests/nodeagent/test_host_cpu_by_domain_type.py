"""A node's CPU labels are those of the guests it runs: libvirt's host-model CPU for the
domain type its guests get. On a host with /dev/kvm whose guests run under TCG (the agent's
`--hypervisor qemu`, or KVM that failed the probe), the KVM host-model (here `kvm64`, an
obsolete model, so no host-model label) is not what its guests get: every VMI with the
default `host-model` CPU was unschedulable there ("didn't match Pod's node affinity")."""

from __future__ import annotations

import contextlib

import libvirt

from nodeagent.hostcpu import CpuMap, HostCpu, from_domain_capabilities, host_cpu
from tests.realhost import URI, libvirtd

__all__ = ["libvirtd"]  # a fixture, used by name

ARCH = "x86_64"


def test_the_host_cpu_is_the_one_of_the_domain_type_guests_get(libvirtd: None) -> None:
    conn = libvirt.open(URI)
    try:
        expected: dict[str, HostCpu] = {}
        for domain_type in ("qemu", "kvm"):  # kvm where libvirt offers it on this host
            with contextlib.suppress(libvirt.libvirtError):
                expected[domain_type] = from_domain_capabilities(
                    conn.getDomainCapabilities(None, ARCH, None, domain_type, 0),
                    CpuMap(conn, ARCH, domain_type))
        found = {domain_type: host_cpu(conn, CpuMap(conn, ARCH, domain_type), "")
                 for domain_type in expected}
    finally:
        conn.close()
    assert "qemu" in expected
    assert found == expected
