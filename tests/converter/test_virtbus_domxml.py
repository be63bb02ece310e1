"""`virtbus domxml -f FILE` through the user-facing CLI (which runs the converter as its own
process, `python -m nodeagent domxml`): domain XML out, or `error: <field>: <rule>` and 1."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

from controlplane.cli import main
from tests.converter.golden import GOLDEN_DIR

if TYPE_CHECKING:
    import pathlib

    import pytest


def test_virtbus_domxml_prints_domain_xml(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["domxml", "-f", str(GOLDEN_DIR / "cpu-topology.yaml")]) == 0
    domain = ET.fromstring(capfd.readouterr().out)
    assert domain.tag == "domain" and domain.get("type") == "kvm"
    assert domain.find("cpu/topology") is not None


def test_virtbus_domxml_refuses_an_invalid_spec(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((GOLDEN_DIR / "inputs.yaml").read_text().replace("bus: virtio", "bus: ps2"))
    assert main(["domxml", "-f", str(bad)]) == 1
    captured = capfd.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "error: spec.domain.devices.inputs[0].bus: must be one of virtio, usb; got 'ps2'\n"
    )
