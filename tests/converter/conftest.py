"""Shared fixtures: libvirt's test driver, the real thing rather than a mock."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libvirt
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="module")
def test_driver() -> Iterator[libvirt.virConnect]:
    conn = libvirt.open("test:///default")
    yield conn
    conn.close()
