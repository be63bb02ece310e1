"""Fixtures shared by every test: a real nats-server on a free loopback port."""

from __future__ import annotations

import uuid

import pytest

from tests.natsserver import shared_server


@pytest.fixture(scope="session")
def nats_url() -> str:
    return shared_server().url


@pytest.fixture
def prefix() -> str:
    """A fresh prefix per test: its own streams and buckets on the shared server."""
    return "t" + uuid.uuid4().hex[:12]
