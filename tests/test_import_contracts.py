"""The design's direction of imports, enforced: `events` imports none of the others,
`projections` and `nodeagent` only `events`, `controlplane` never `nodeagent`; the user's side
(`controlplane.user`) none of the server's modules, and the server none of it."""

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


CONTROLPLANE_MODULE = re.compile(r"^\s*(?:from|import)\s+(controlplane(?:\.\w+)*)", re.MULTILINE)
USER_SIDE = "controlplane.user"
USER_DIR = ROOT / "controlplane" / "user"
SHARED_WITH_THE_USER = {"controlplane.defaults", "controlplane.context"}
"""Constants and the context file that `virtbus up` writes and every other command reads."""
STARTS_THE_SERVER = {"controlplane/user/actions.py": {"controlplane.up"}}
"""`virtbus up` runs the control plane: the one command that imports it (when it runs)."""


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


def controlplane_modules(path: Path) -> set[str]:
    return set(CONTROLPLANE_MODULE.findall(path.read_text()))


def test_the_user_side_imports_no_server_module() -> None:
    offenders = {}
    for path in USER_DIR.rglob("*.py"):
        name = str(path.relative_to(ROOT))
        allowed = SHARED_WITH_THE_USER | STARTS_THE_SERVER.get(name, set())
        server = {m for m in controlplane_modules(path)
                  if not m.startswith(USER_SIDE) and m not in allowed}
        if server:
            offenders[name] = sorted(server)
    assert offenders == {}


def test_the_server_imports_nothing_of_the_user_side() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in controlplane_modules(path)
                                            if m.startswith(USER_SIDE))
        for path in (ROOT / "controlplane").rglob("*.py")
        if USER_DIR not in path.parents
        and any(m.startswith(USER_SIDE) for m in controlplane_modules(path))
    }
    assert offenders == {}


def test_every_package_is_typed() -> None:
    assert all((ROOT / p / "py.typed").exists() for p in PACKAGES)
