"""Which handler decides a command: the one its kind's home registered (`@handles` in
`controlplane/<kind>/commands.py`), else, for a kind declared with nothing of its own, the
generic one (`controlplane.objects`); `patch`, for every kind `apply` admits, the generic
patch (`controlplane.objects.patch`).

Importing this module imports the `commands` module of every package of the control plane,
so every kind's handlers are registered with nothing listing them."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import Final

from controlplane.decision import HANDLERS, Handler
from controlplane.objects.commands import generic_handler
from controlplane.objects.patch import patch_handler

USER_SIDE: Final = "user"
"""The user's side (`controlplane.user`): no kind's home, never loaded into the server."""

MODULES: Final[tuple[ModuleType, ...]] = tuple(
    importlib.import_module(f"{__package__}.{package.name}.commands")
    for package in pkgutil.iter_modules([str(Path(__file__).parent)])
    if package.ispkg and package.name != USER_SIDE
    and (Path(__file__).parent / package.name / "commands.py").exists())
"""Every kind's home's `commands` module, in name order."""


def handler_for(kind: str, verb: str) -> Handler | None:
    """The handler of `verb` for `kind`, or None: the command is refused. `patch` is the
    generic one (`controlplane.objects.patch`) for every kind with a manifest, decided by
    its kind's `apply`."""
    return HANDLERS.get((kind, verb)) or generic_handler(kind, verb) or patch_handler(kind, verb)
