"""How long one scheduling decision takes: one VMI among N nodes, each labelled (CPU models
and features, zones) and some tainted, with M VMIs placed already. The read model is folded
from events in memory (no server: this measures the decision, not the log), and the figures
are printed as one JSON line, with the layer beneath measured in the same run: msgspec
decoding the VMI's spec (`raw_decode_us`; `ratio` = a constrained decision / that).

    python -m bench.scheduling [--nodes 100] [--placed 1000] [--decisions 2000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec

from controlplane.scheduling import decide
from controlplane.scheduling.facts import demand_of
from controlplane.scheduling.ledger import Ledger
from events.api.base import ObjectMeta
from events.api.node import NodeInfo
from events.api.resources import DEFAULT_TUNING
from events.api.scheduling import Taint
from events.api.vm import VirtualMachineInstanceSpec
from events.language.codec import Event
from events.language.kinds.nodes import NODE_KIND, NodeReady, NodeRegistered, NodeTaintsChanged
from events.language.kinds.vm import (
    VMI_KIND,
    VirtualMachineInstanceCreated,
    VirtualMachineInstanceScheduled,
)
from events.language.subjects import aggregate_id
from projections.cluster import ClusterState

AT = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = {"domain": {"cpu": {"model": "Haswell", "features": [{"name": "aes"}]},
                   "resources": {"requests": {"memory": "256Mi"}}},
        "nodeSelector": {"zone": "a"},
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [
                {"key": "ssd", "operator": "Exists"}]}}]}}}


def _event(cls: type[Event], agg: str, version: int, **fields: Any) -> Event:
    return cls(originator_id=agg, originator_version=version, timestamp=AT, actor="bench",
               correlation_id="c", causation_id="c", **fields)


def cluster(nodes: int, placed: int) -> ClusterState:
    state = ClusterState()
    for i in range(nodes):
        agg = aggregate_id(NODE_KIND, "", f"node-{i:03}")
        labels = {"cpu-model.node.kubevirt.io/Haswell": "true",
                  "cpu-feature.node.kubevirt.io/aes": "true", "zone": "ab"[i % 2],
                  **({"ssd": "true"} if i % 3 == 0 else {})}
        alloc = {"cpu": "64", "memory": "256Gi", "pods": "110",
                 "devices.kubevirt.io/kvm": "110", "devices.kubevirt.io/tun": "110"}
        info = NodeInfo(node_name=f"node-{i:03}", hostname="h", architecture="x86_64",
                        hypervisor_uri="qemu:///system", domain_type="kvm",
                        libvirt_version="10.0.0", capacity=alloc, allocatable=alloc,
                        labels=labels)
        state.apply(_event(NodeRegistered, agg, 1, info=info))
        state.apply(_event(NodeReady, agg, 2))
        if i % 5 == 0:
            state.apply(_event(NodeTaintsChanged, agg, 3,
                               taints=[Taint(key="spot", effect="PreferNoSchedule")]))
    spec = msgspec.convert(SPEC, VirtualMachineInstanceSpec)
    for j in range(placed):
        agg = aggregate_id(VMI_KIND, "default", f"placed-{j}")
        meta = ObjectMeta(name=f"placed-{j}", namespace="default")
        state.apply(_event(VirtualMachineInstanceCreated, agg, 1, uid=str(uuid.uuid4()),
                           metadata=meta, spec=spec))
        state.apply(_event(VirtualMachineInstanceScheduled, agg, 2,
                           node=f"node-{2 * j % nodes:03}"))
    incoming = aggregate_id(VMI_KIND, "default", "incoming")
    state.apply(_event(VirtualMachineInstanceCreated, incoming, 1, uid=str(uuid.uuid4()),
                       metadata=ObjectMeta(name="incoming", namespace="default"), spec=spec))
    return state


def _decisions(state: ClusterState, spec: VirtualMachineInstanceSpec,
               decisions: int) -> tuple[list[float], int]:
    """Microseconds of each decision (demand derived, nodes filtered and scored) for the
    incoming VMI, each counted in the ledger as the scheduler does (under a holder of its
    own, as if each were another VMI); and how many placed."""
    ledger = Ledger.of(state.nodes(), state.vmis(), DEFAULT_TUNING)
    vmi = state.vmi("default", "incoming")
    if vmi is None:
        raise SystemExit("the incoming VMI is missing")
    times: list[float] = []
    placements = 0
    for i in range(decisions):
        started = time.perf_counter()
        demand = demand_of(vmi, spec, None, DEFAULT_TUNING)
        derived = time.perf_counter() - started
        demand = dataclasses.replace(demand, holder=f"{demand.holder}-{i}")
        started = time.perf_counter()
        placement = decide(demand, ledger, 0)
        times.append((derived + time.perf_counter() - started) * 1e6)
        placements += placement.node is not None
    return sorted(times), placements


def measure(nodes: int, placed: int, decisions: int) -> dict[str, float | int]:
    state = cluster(nodes, placed)
    Ledger.of(state.nodes(), state.vmis(), DEFAULT_TUNING)  # warm-up: the quantity parser
    started = time.perf_counter()
    Ledger.of(state.nodes(), state.vmis(), DEFAULT_TUNING)
    figures: dict[str, float | int] = {
        "nodes": nodes, "placed_vmis": placed, "decisions": decisions,
        "ledger_build_ms": round((time.perf_counter() - started) * 1000, 2)}
    plain = msgspec.convert({"domain": SPEC["domain"]}, VirtualMachineInstanceSpec)
    for case, spec in (("constrained", msgspec.convert(SPEC, VirtualMachineInstanceSpec)),
                       ("plain", plain)):
        times, placements = _decisions(state, spec, decisions)
        figures[f"{case}_placed"] = placements
        figures[f"{case}_decision_us_p50"] = round(statistics.median(times), 1)
        figures[f"{case}_decision_us_p99"] = round(times[int(len(times) * 0.99) - 1], 1)
    figures["raw_decode_us"] = raw = _decode_us(decisions)
    figures["ratio"] = round(float(figures["constrained_decision_us_p50"]) / raw, 1)
    return figures


def _decode_us(times: int) -> float:
    """The layer beneath, in the same run: msgspec decoding the VMI's spec from the JSON
    its event carries (median microseconds); `ratio` is a decision in those units."""
    encoded = msgspec.json.encode(SPEC)
    decode = msgspec.json.Decoder(VirtualMachineInstanceSpec).decode
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        decode(encoded)
        samples.append((time.perf_counter() - started) * 1e6)
    return round(statistics.median(samples), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--placed", type=int, default=1000)
    parser.add_argument("--decisions", type=int, default=2000)
    args = parser.parse_args()
    print(json.dumps(measure(args.nodes, args.placed, args.decisions)))


if __name__ == "__main__":
    main()
