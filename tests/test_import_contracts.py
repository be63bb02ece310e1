"""The design's direction of imports, enforced: `events` imports none of the others,
`projections` and `nodeagent` only `events`, `controlplane` never `nodeagent`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("events", "projections", "controlplane", "nodeagent")
ALLOWED = {
    "events": {"events"},
    "projections": {"events", "projections"},
    "nodeagent": {"events", "nodeagent"},
    "controlplane": {"events", "projections", "controlplane"},
}


IMPORT = re.compile(r"^\s*(?:from|import)\s+(\w+)", re.MULTILINE)
"""An import statement's first module (absolute imports only; the project uses no others).

A regex, not `ast`: CPython 3.11's parser can fail with "AST constructor recursion depth
mismatch" when called deep inside a long test run."""


def imported_packages(path: Path) -> set[str]:
    return {m for m in IMPORT.findall(path.read_text()) if m in PACKAGES}


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_follow_the_design(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) - ALLOWED[package])
        for path in (ROOT / package).rglob("*.py")
        if imported_packages(path) - ALLOWED[package]
    }
    assert offenders == {}


def test_every_package_is_typed() -> None:
    assert all((ROOT / p / "py.typed").exists() for p in PACKAGES)
