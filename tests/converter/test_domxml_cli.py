"""`virtbus domxml -f FILE`: XML on stdout, or `error: <field>: <rule>` and exit 1."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeagent.domxml import main_domxml
from tests.converter.golden import GOLDEN_DIR, expected_xml

if TYPE_CHECKING:
    import pathlib

    import pytest


def test_prints_domain_xml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_domxml(["-f", str(GOLDEN_DIR / "minimal.yaml"), "--domain-type", "test"]) == 0
    assert capsys.readouterr().out == expected_xml("minimal")


def test_multi_document_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    both = tmp_path / "both.yaml"
    parts = [(GOLDEN_DIR / f"{case}.yaml").read_text() for case in ("minimal", "rng")]
    both.write_text("---\n".join(parts))
    assert main_domxml(["-f", str(both), "--domain-type", "test"]) == 0
    assert capsys.readouterr().out == expected_xml("minimal") + expected_xml("rng")


def test_invalid_spec_names_field_and_rule(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    source = (GOLDEN_DIR / "inputs.yaml").read_text()
    bad.write_text(source.replace("bus: virtio", "bus: ps2"))
    assert main_domxml(["-f", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "error: spec.domain.devices.inputs[0].bus: must be one of virtio, usb; got 'ps2'\n"
    )


def test_missing_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_domxml(["-f", str(tmp_path / "absent.yaml")]) == 1
    assert capsys.readouterr().err.startswith("error: ")
