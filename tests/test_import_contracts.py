"""The design's direction of imports, enforced: `events` imports none of the others,
`projections` and `nodeagent` only `events`, `controlplane` never `nodeagent`."""

from __future__ import annotations

import ast
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


def imported_packages(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found |= {n.split(".")[0] for n in names if n.split(".")[0] in PACKAGES}
    return found


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
