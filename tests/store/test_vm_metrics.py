"""KubeVirt's VM and VMI metrics on `/metrics`: functions of the log, so the read model a
replay rebuilds scrapes the same text as the one folded live."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from projections.cluster import ClusterState
from projections.http import respond
from projections.rendering import render
from tests.store.test_run_strategies import Cluster, cluster  # noqa: F401  (the fixture)


def scrape(state: ClusterState) -> str:
    code, _, body = respond(state, render, "/metrics")
    assert code == 200
    return body.decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, metric: str, **labels: str) -> float:
    found = [v for (n, ls), v in samples(text).items()
             if n == metric and set(labels.items()) <= ls]
    assert len(found) == 1, (metric, labels, found)
    return found[0]


def test_vm_and_vmi_metrics_are_kubevirts_and_a_replay_gives_the_same_text(
        cluster: Cluster) -> None:  # noqa: F811
    cluster.apply("web")
    cluster.apply("crash")
    cluster.apply("idle", "Halted")
    cluster.apply("huge", memory="1Ti")
    cluster.settle()
    cluster.report("web", "Running")
    cluster.fail_to_start("crash")
    assert cluster.user("delete", "idle").accepted
    cluster.apply("idle", "Halted")  # created twice: counted twice

    text = scrape(cluster.state)
    assert text == scrape(cluster.replayed())

    assert value(text, "kubevirt_vmi_phase_count", node="n1", phase="running") == 1
    assert value(text, "kubevirt_vmi_phase_count", node="", phase="pending") == 1
    assert value(text, "kubevirt_vmi_info", name="web", phase="running", node="n1",
                 evictable="true", outdated="false") == 1
    assert value(text, "kubevirt_vm_info", name="web", status="running",
                 status_group="running") == 1
    assert value(text, "kubevirt_vm_info", name="crash", status="crashloopbackoff",
                 status_group="error") == 1
    assert value(text, "kubevirt_vm_info", name="huge", status="errorunschedulable",
                 status_group="error") == 1
    assert value(text, "kubevirt_vm_info", name="idle", status="stopped",
                 status_group="non_running") == 1
    assert value(text, "kubevirt_vm_running_status_last_transition_timestamp_seconds_total",
                 name="web") > 0
    assert value(text, "kubevirt_vm_error_status_last_transition_timestamp_seconds_total",
                 name="web") == 0
    assert value(text, "kubevirt_vm_error_status_last_transition_timestamp_seconds_total",
                 name="crash") > 0
    assert value(text, "kubevirt_vm_create_date_timestamp_seconds", name="web") > 0
    assert value(text, "kubevirt_vm_created_total", namespace="default") == 5
