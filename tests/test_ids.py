"""Ids made as text are the text `uuid` would print: ids already in logs keep deduping."""

from __future__ import annotations

import uuid

import pytest

from events.language.ids import name_uuid, random_uuid

NAMESPACE = uuid.UUID("0d3c6f7e-2b1a-5e4d-9c8b-7a6f5e4d3c2b")


@pytest.mark.parametrize("name", ["", "vmi.default.x:3", "ünï ⊂ names", "x" * 1000])
def test_a_name_uuid_is_uuid5_s_text(name: str) -> None:
    assert name_uuid(NAMESPACE, name) == str(uuid.uuid5(NAMESPACE, name))


def test_a_random_uuid_is_a_version_4_uuid_s_text() -> None:
    made = [random_uuid() for _ in range(1000)]
    for text in made:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)
    assert len(set(made)) == len(made)
