"""Each kind's read side, a module per kind or family of kinds: the views that fold its
events (each `View` subclass names the aggregate-id tokens it folds) and how a view renders
without the rest of the cluster.

Every module of this package is imported with it, so `FOLDS` holds every fold with nothing
listing the modules; a declared kind that no module folds is folded by `ObjectView` (its
objects as applied)."""

import importlib
import pkgutil
from types import ModuleType
from typing import Final

from events.api.kinds import declared, generation, of_token
from projections.kinds.objects import ObjectView
from projections.views import View

MODULES: tuple[ModuleType, ...] = tuple(
    importlib.import_module(f"{__name__}.{module.name}")
    for module in pkgutil.iter_modules(__path__))
"""Every module of the package, in name order."""

FOLDS: Final = View.FOLDS
"""Aggregate-id token -> the view that folds its events."""


_UNFOLDED: dict[int, set[str]] = {}
"""Tokens of no declared kind (a command's marker, say), by the declarations' generation
they were looked up in."""


def fold_of(token: str) -> type[View] | None:
    """The view that folds `token`'s events: its own, else `ObjectView` for a declared
    kind's (remembered in `FOLDS`, so a kind declared after this package loaded is folded
    from then on), else None (no kind of this version; remembered until a kind is
    declared)."""
    fold = FOLDS.get(token)
    if fold is not None:
        return fold
    unfolded = _UNFOLDED.get(generation())
    if unfolded is None:
        _UNFOLDED.clear()
        unfolded = _UNFOLDED[generation()] = set()
    if token in unfolded:
        return None
    if of_token(token) is None:
        unfolded.add(token)
        return None
    FOLDS[token] = ObjectView
    return ObjectView


for _kind in declared():
    fold_of(_kind.token)
