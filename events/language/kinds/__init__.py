"""Each kind's events, a module per kind or family of kinds, beside the aggregate-id token
its declaration (`events.api.kinds`) names.

Every module of this package is imported with it: a new kind's module is found here, not
added to a list."""

import importlib
import pkgutil
from types import ModuleType

MODULES: tuple[ModuleType, ...] = tuple(
    importlib.import_module(f"{__name__}.{module.name}")
    for module in pkgutil.iter_modules(__path__))
"""Every module of the package, in name order."""
