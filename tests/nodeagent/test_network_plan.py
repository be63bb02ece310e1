"""Which tap, MAC and address each guest interface gets (`nodeagent.network.nics`), what the
converter writes for them, and what the agent refuses: no host is touched here."""

from __future__ import annotations

import ipaddress
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import msgspec
import pytest

from events.api.errors import InvalidSpec
from events.api.vm import VirtualMachineInstanceSpec
from nodeagent.converter import ConverterContext, convert
from nodeagent.network.nics import NicTable, derived_mac, tap_name
from nodeagent.network.node import check_bridge, host_interfaces, parse_subnet
from nodeagent.network.tools import NetworkError

SUBNET = ipaddress.IPv4Network("10.0.2.0/24")


def spec(*interfaces: dict[str, Any], networks: list[dict[str, Any]] | None = None
         ) -> VirtualMachineInstanceSpec:
    names = [i["name"] for i in interfaces]
    return msgspec.convert({
        "domain": {"devices": {"interfaces": list(interfaces)}},
        "networks": networks if networks is not None else [{"name": n, "pod": {}} for n in names],
    }, VirtualMachineInstanceSpec)


def masquerade(name: str = "default", **extra: Any) -> dict[str, Any]:
    return {"name": name, "masquerade": {}, **extra}


def test_the_first_guest_gets_kubevirts_masquerade_address_and_each_next_the_lowest_free(
        tmp_path: Path) -> None:
    table = NicTable(tmp_path / "nics.json", SUBNET)
    [a] = table.assign("uid-a", "ns", "a", spec(masquerade()))
    [b] = table.assign("uid-b", "ns", "b", spec({"name": "default", "bridge": {}}))
    assert (a.ip, a.masquerade, b.ip, b.masquerade) == ("10.0.2.2", True, "10.0.2.3", False)
    assert table.forget({"uid-a"}) == [a]
    [c] = table.assign("uid-c", "ns", "c", spec(masquerade()))
    assert c.ip == "10.0.2.2"


def test_a_launch_done_again_gets_the_same_interfaces_and_a_restart_reads_them_back(
        tmp_path: Path) -> None:
    table = NicTable(tmp_path / "nics.json", SUBNET)
    first = table.assign("uid-a", "ns", "a", spec(masquerade()))
    assert table.assign("uid-a", "ns", "a", spec(masquerade())) == first
    assert NicTable(tmp_path / "nics.json", SUBNET).nics == first


def test_taps_and_macs_are_the_uids_and_a_given_mac_is_kept(tmp_path: Path) -> None:
    table = NicTable(tmp_path / "nics.json", SUBNET)
    [a] = table.assign("uid-a", "ns", "a", spec(masquerade()))
    assert (a.tap, a.mac) == (tap_name("uid-a", 0), derived_mac("uid-a", 0))
    assert len(a.tap) <= 15 and a.mac.startswith("52:54:00:")
    assert tap_name("uid-a", 0) != tap_name("uid-b", 0)
    [b] = table.assign("uid-b", "ns", "b", spec(masquerade(macAddress="02:AA:BB:CC:DD:EE")))
    assert b.mac == "02:aa:bb:cc:dd:ee"
    with pytest.raises(NetworkError, match="02:aa:bb:cc:dd:ee is another guest's"):
        table.assign("uid-c", "ns", "c", spec(masquerade(macAddress="02:aa:bb:cc:dd:ee")))


def test_a_full_subnet_refuses_the_next_guest(tmp_path: Path) -> None:
    table = NicTable(tmp_path / "nics.json", ipaddress.IPv4Network("10.0.2.0/30"))
    [only] = table.assign("uid-a", "ns", "a", spec(masquerade()))
    assert only.ip == "10.0.2.2"  # .1 is the gateway, .3 the broadcast
    with pytest.raises(NetworkError, match="no free address"):
        table.assign("uid-b", "ns", "b", spec(masquerade()))
    assert table.of("uid-b") == []


def test_an_interface_on_another_network_than_the_pod_network_is_refused() -> None:
    multus = spec(masquerade("fast"), networks=[
        {"name": "fast", "multus": {"networkName": "fast-net"}}])
    with pytest.raises(InvalidSpec) as refused:
        host_interfaces("uid-a", multus)
    assert (refused.value.field, refused.value.rule) == (
        "spec.networks[0]", "this node has only the pod network")
    with pytest.raises(InvalidSpec, match=r"interfaces\[0\].name: no network named 'lost'"):
        host_interfaces("uid-a", spec(masquerade("lost"), networks=[]))


def test_the_converter_writes_the_agents_tap_and_mac() -> None:
    guest = spec(masquerade())
    ctx = ConverterContext(name="a", uid="uid-a", domain_type="qemu",
                           host_interfaces=host_interfaces("uid-a", guest))
    interface = ET.fromstring(convert(guest, ctx)).find("devices/interface")
    assert interface is not None
    assert interface.find("target").attrib == {"dev": tap_name("uid-a", 0),
                                               "managed": "no"}
    assert interface.find("mac").get("address") == derived_mac("uid-a", 0)
    # the test driver's (no host interfaces): KubeVirt's in-pod tap, libvirt's own MAC
    plain = ET.fromstring(convert(guest, ConverterContext(name="a", domain_type="test")))
    assert plain.find("devices/interface/target").get("dev") == "tap0"
    assert plain.find("devices/interface/mac") is None


@pytest.mark.parametrize(("check", "text", "rule"), [
    (check_bridge, "br 0", "must be 1-15 letters"),
    (check_bridge, "a-bridge-name-too-long", "must be 1-15 letters"),
    (parse_subnet, "10.0.2.0/33", "is not an IPv4 network"),
    (parse_subnet, "10.0.2.1/24", "is not an IPv4 network"),
    (parse_subnet, "10.0.2.0/31", "has no room for a gateway and a guest"),
])
def test_bad_network_options_are_refused_naming_the_rule(check: Any, text: str,
                                                         rule: str) -> None:
    with pytest.raises(InvalidSpec, match=rule):
        check(text)


def test_an_unreadable_table_is_refused_rather_than_guessed(tmp_path: Path) -> None:
    (tmp_path / "nics.json").write_text('[{"uid": 1}]')
    with pytest.raises(NetworkError, match=r"nics\.json is not a list of guest interfaces"):
        NicTable(tmp_path / "nics.json", SUBNET)
