"""`virtbus domxml -f FILE` through the user-facing CLI, as its own process (the CLI runs
the converter as `python -m nodeagent domxml`): domain XML out, or `error: <field>: <rule>`
and exit status 1."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

from tests.converter.golden import GOLDEN_DIR

if TYPE_CHECKING:
    import pathlib


def virtbus_domxml(path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane.user.cli", "domxml", "-f",
                           str(path)], capture_output=True, text=True, check=False, timeout=60)


def test_virtbus_domxml_prints_domain_xml() -> None:
    done = virtbus_domxml(GOLDEN_DIR / "cpu-topology.yaml")
    assert done.returncode == 0, done.stderr
    domain = ET.fromstring(done.stdout)
    assert domain.tag == "domain" and domain.get("type") == "kvm"
    assert domain.find("cpu/topology") is not None


def test_virtbus_domxml_refuses_an_invalid_spec(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((GOLDEN_DIR / "inputs.yaml").read_text().replace("bus: virtio", "bus: ps2"))
    done = virtbus_domxml(bad)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        "error: spec.domain.devices.inputs[0].bus: must be one of virtio, usb; got 'ps2'\n"
    )
