"""Go duration strings parse and print as Go does."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controlplane.hco.duration import format_go_duration, parse_go_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("48h0m0s", timedelta(hours=48)),
        ("1h", timedelta(hours=1)),
        ("10m", timedelta(minutes=10)),
        ("1m30s", timedelta(seconds=90)),
        ("1.5h", timedelta(minutes=90)),
        ("500ms", timedelta(milliseconds=500)),
        ("300us", timedelta(microseconds=300)),
        ("0", timedelta(0)),
        ("-2m", timedelta(minutes=-2)),
    ],
)
def test_parse(text: str, expected: timedelta) -> None:
    assert parse_go_duration(text) == expected


@pytest.mark.parametrize("text", ["", "1", "h", "1x", "1h-2m", "--1h", "1 h"])
def test_parse_refuses_what_go_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(hours=48), "48h0m0s"),
        (timedelta(minutes=10), "10m0s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(0), "0s"),
    ],
)
def test_format(value: timedelta, text: str) -> None:
    assert format_go_duration(value) == text
