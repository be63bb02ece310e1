"""Build a HyperConverged from a YAML manifest, as a user would write it."""

from __future__ import annotations

import msgspec
import yaml

from events.api.hco import HyperConverged


def load(text: str) -> HyperConverged:
    return msgspec.convert(yaml.safe_load(text), HyperConverged)


def spec(text: str) -> HyperConverged:
    """A HyperConverged whose spec is the given YAML mapping."""
    return msgspec.convert({"spec": yaml.safe_load(text)}, HyperConverged)
