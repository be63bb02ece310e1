"""Node CPU labels follow the cluster's `obsoleteCPUs`: the agents read `obsoleteCPUModels`
and `minCPUModel` from the effective KubeVirt configuration when they rediscover."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from controlplane.user.client import Client
from events.api import hco_defaults as d
from tests.system.harness import System, eventually, ready_nodes

MODEL = "cpu-model.node.kubevirt.io/"
FEATURE = "cpu-feature.node.kubevirt.io/"


def labels_where(vb: Client, test: Callable[[dict[str, str]], bool]
                 ) -> Callable[[], Coroutine[Any, Any, dict[str, str] | None]]:
    async def probe() -> dict[str, str] | None:
        [node] = await vb.query("Node", name="node-1")
        labels: dict[str, str] = node["metadata"]["labels"]
        return labels if test(labels) else None
    return probe


def kubevirt_cpu_policy(vb: Client) -> Callable[[], Coroutine[Any, Any, bool]]:
    """The effective KubeVirt CR carries the patch: what the agent reads next."""
    async def probe() -> bool:
        [kubevirt] = await vb.query("KubeVirt")
        config = kubevirt["spec"]["configuration"]
        return bool(config["obsoleteCPUModels"].get("SandyBridge")
                    and config["minCPUModel"] == "Nehalem")
    return probe


async def test_obsolete_cpu_models_and_min_cpu_model_reach_node_labels(
        nats_url: str, prefix: str, tmp_path: Path) -> None:
    system = System(nats_url, prefix, tmp_path, nodes=1)
    system.args["node-1"] += ["--rediscovery-interval", "0.5"]
    try:
        system.start_all()
        async with await Client.connect(nats_url, prefix, actor="user:carol") as vb:
            await eventually(lambda: ready_nodes(vb, 1), what="node Ready")
            before = await eventually(
                labels_where(vb, lambda labels: MODEL + "SandyBridge" in labels),
                what="SandyBridge offered by a Haswell host")
            assert FEATURE + "ssse3" not in before  # Penryn's own features are left out
            await vb.patch("HyperConverged", d.DEFAULT_NAMESPACE, d.DEFAULT_NAME, {"spec": {
                "obsoleteCPUs": {"cpuModels": ["SandyBridge"], "minCPUModel": "Nehalem"}}})
            await eventually(kubevirt_cpu_policy(vb), what="the KubeVirt CR's new CPU policy")
            after = await eventually(
                labels_where(vb, lambda labels: MODEL + "SandyBridge" not in labels),
                what="SandyBridge obsolete on the node")
            assert MODEL + "Haswell-noTSX" in after
            assert MODEL + "Penryn" in before and FEATURE + "popcnt" in before
            assert FEATURE + "popcnt" not in after  # popcnt is in Nehalem, the new minimum
    finally:
        system.stop_all()
