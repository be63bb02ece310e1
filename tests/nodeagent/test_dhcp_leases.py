"""dnsmasq rewrites its lease file in place (truncated, then written out): a lease read
while it does is not taken for no lease."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.network import dhcp

LEASE = "1790000000 52:54:00:aa:bb:cc 10.0.0.2 guest 01:52:54:00:aa:bb:cc\n"


def test_a_lease_file_caught_while_rewritten_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "dnsmasq.leases"
    path.write_text(LEASE)
    seen = iter(["", LEASE[:20], LEASE, LEASE])  # truncated, half written, whole
    monkeypatch.setattr(dhcp, "_read_text", lambda _path: next(seen))
    assert dhcp.read_leases(path) == {"52:54:00:aa:bb:cc": dhcp.Lease(
        mac="52:54:00:aa:bb:cc", ip="10.0.0.2", client_id="01:52:54:00:aa:bb:cc")}


def test_a_missing_or_empty_lease_file_holds_no_lease(tmp_path: Path) -> None:
    path = tmp_path / "dnsmasq.leases"
    assert dhcp.read_leases(path) == {}
    path.write_text("")
    assert dhcp.read_leases(path) == {}
