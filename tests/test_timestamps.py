"""Timestamps render as Kubernetes writes them: RFC 3339 in UTC, to the second."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from projections.views import iso


@pytest.mark.parametrize(("at", "rendered"), [
    (datetime(2026, 11, 23, 19, 49, 39, 999_999, tzinfo=UTC), "2026-11-23T19:49:39Z"),
    (datetime(2026, 11, 24, 0, 49, 39, tzinfo=timezone(timedelta(hours=5))),
     "2026-11-23T19:49:39Z"),
    (datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC), "1969-12-31T23:59:59Z"),
    (datetime(2026, 1, 1), "2026-01-01T00:00:00Z"),  # naive: taken as written
    (None, ""),
])
def test_a_timestamp_renders_in_utc_to_the_second(at: datetime | None, rendered: str) -> None:
    assert iso(at) == rendered
    assert iso(at) == rendered  # and the same from the per-second cache
