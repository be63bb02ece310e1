"""The metrics/alerts fold: explicit times only, so replay gives the same answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

from projections.hco_metrics import (
    CR_MODIFIED_ALERT,
    OUT_OF_BAND_MODIFICATIONS,
    UNSAFE_MODIFICATIONS,
    UNSUPPORTED_MODIFICATION_ALERT,
    HcoMetrics,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KV = "kubevirt-kubevirt-hyperconverged"
ANNOTATION = "kubevirt.kubevirt.io/jsonpatch"


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def names(metrics: HcoMetrics, now: datetime) -> list[tuple[str, str, dict[str, str]]]:
    return [(a.name, a.severity, a.labels) for a in metrics.alerts(now)]


def test_cr_modified_fires_and_resolves_ten_minutes_after_last_revert() -> None:
    metrics = HcoMetrics()
    assert metrics.alerts(T0) == []
    metrics.on_revert(KV, T0)
    assert names(metrics, minutes(0)) == [(CR_MODIFIED_ALERT, "warning", {"component_name": KV})]
    metrics.on_revert(KV, minutes(6))
    assert metrics.alerts(minutes(15))[0].active_since == T0
    assert metrics.alerts(minutes(15.99))
    assert metrics.alerts(minutes(16)) == []


def test_a_new_streak_starts_a_new_alert() -> None:
    metrics = HcoMetrics()
    metrics.on_revert(KV, T0)
    metrics.on_revert(KV, minutes(30))
    assert metrics.alerts(minutes(31))[0].active_since == minutes(30)


def test_alerts_per_component() -> None:
    metrics = HcoMetrics()
    metrics.on_revert(KV, T0)
    metrics.on_revert("cdi-kubevirt-hyperconverged", minutes(5))
    assert [a.labels["component_name"] for a in metrics.alerts(minutes(12))] == [
        "cdi-kubevirt-hyperconverged"
    ]


def test_unsupported_modification_while_annotation_present() -> None:
    metrics = HcoMetrics()
    metrics.on_annotations({ANNOTATION: 2}, T0)
    assert names(metrics, minutes(100)) == [
        (UNSUPPORTED_MODIFICATION_ALERT, "info", {"annotation_name": ANNOTATION})
    ]
    metrics.on_annotations({}, minutes(101))
    assert metrics.alerts(minutes(102)) == []


def samples(metrics: HcoMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_exposition_has_help_type_and_values() -> None:
    metrics = HcoMetrics()
    metrics.on_revert(KV, T0)
    metrics.on_revert(KV, minutes(1))
    metrics.on_annotations({ANNOTATION: 1}, T0)
    metrics.on_annotations({}, minutes(2))
    text = metrics.exposition().decode()
    assert f"# TYPE {OUT_OF_BAND_MODIFICATIONS} counter" in text
    assert f"# HELP {UNSAFE_MODIFICATIONS} " in text
    assert f"# TYPE {UNSAFE_MODIFICATIONS} gauge" in text
    assert samples(metrics) == {
        (OUT_OF_BAND_MODIFICATIONS, (("component_name", KV),)): 2.0,
        (UNSAFE_MODIFICATIONS, (("annotation_name", ANNOTATION),)): 0.0,
    }


def test_replaying_the_same_facts_gives_the_same_state() -> None:
    facts = [(KV, minutes(i * 3)) for i in range(5)]

    def fold() -> HcoMetrics:
        metrics = HcoMetrics()
        for component, at in facts:
            metrics.on_revert(component, at)
        return metrics

    first, second = fold(), fold()
    assert first.exposition() == second.exposition()
    assert first.alerts(minutes(20)) == second.alerts(minutes(20))
