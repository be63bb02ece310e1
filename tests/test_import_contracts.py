"""The import contracts (`[tool.importlinter]` in pyproject.toml, which `./dev test` runs as
`lint-imports`) hold on the tree, and break when an import crosses them: each plant below is
made in a copy of the packages, where `lint-imports` must name the contract it breaks. A
plant under `TYPE_CHECKING` counts like any import. The product imports modules by name
(`importlib`) only to load every module of its own package (or every kind's home's
`commands`), never across one."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("events", "projections", "controlplane", "nodeagent")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_tree_keeps_every_contract() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages and the contracts, copied once: each plant edits one file and puts it
    back."""
    root = tmp_path_factory.mktemp("tree")
    shutil.copy(ROOT / "pyproject.toml", root)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return root


PLANTS = [
    ("events/api/base.py", "import projections.views",
     "The writers over the readers and the node agents, over the ground"),
    ("nodeagent/defaults.py", "import projections.views",
     "The writers over the readers and the node agents, over the ground"),
    ("events/api/names.py", "import events.language.subjects",
     "events: authorization over jetstream over language over api"),
    ("events/language/kinds/vm.py", "import events.language.kinds.hco",
     "Each kind's words stand alone"),
    ("projections/kinds/vm.py", "import projections.kinds.hco",
     "Each kind's read side needs no cluster state"),
    ("projections/kinds/hco.py", "import projections.cluster",
     "The folds and views read no cluster state"),
    ("controlplane/preset/commands.py", "import controlplane.replicaset.commands",
     "Each kind's home imports only the homes and the shared configuration beneath it"),
    ("controlplane/user/cli.py", "import controlplane.intake",
     "The user's side imports no server module"),
    ("controlplane/intake.py", "import controlplane.user.client",
     "The server imports nothing of the user's side"),
    ("controlplane/defaults.py", "import controlplane.intake", "No import circle"),
    ("events/api/names.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import events.api.kinds",
     "No import circle"),
]


@pytest.mark.parametrize(("path", "plant", "contract"), PLANTS,
                         ids=[f"{p}:{c.split()[0]}" for p, _, c in PLANTS])
def test_an_import_across_a_contract_breaks_it(copy: Path, path: str, plant: str,
                                               contract: str) -> None:
    target = copy / path
    original = target.read_text()
    head, sep, rest = original.partition("from __future__ import annotations\n")
    target.write_text(head + sep + plant + "\n" + rest)
    try:
        done = lint_imports(copy)
    finally:
        target.write_text(original)
    broken = done.stdout.partition("Broken contracts")[2]
    assert done.returncode != 0 and contract in broken, done.stdout[-3000:]


def test_the_copy_keeps_every_contract_without_a_plant(copy: Path) -> None:
    """The plants above are what breaks the copy, nothing else."""
    assert lint_imports(copy).returncode == 0


LOADER = re.compile(r"importlib\.import_module\((.*)\)$", re.MULTILINE)


def test_modules_are_imported_by_name_only_within_their_own_package() -> None:
    """`importlib` loads every module of one package (each kind's declarations, words and
    read side), so nothing lists them; a name built from anything else would be an import no
    contract sees."""
    loaders: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            calls = LOADER.findall(path.read_text())
            if calls or "__import__(" in path.read_text():
                loaders[str(path.relative_to(ROOT))] = calls
    assert loaders == {
        "controlplane/handlers.py": ['f"{__package__}.{package.name}.commands"'],
        "events/api/kinds.py": ['f"{__package__}.{module.name}"'],
        "events/language/kinds/__init__.py": ['f"{__name__}.{module.name}"'],
        "projections/kinds/__init__.py": ['f"{__name__}.{module.name}"'],
    }


def test_every_package_is_typed() -> None:
    assert all((ROOT / p / "py.typed").exists() for p in PACKAGES)
