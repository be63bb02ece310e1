"""The control loop folds a controller's own events in at once, so its next decision sees
them; it must not fold one past a change it has not seen yet, or that change is lost to
it. Seen in CI: a client's HyperConverged patch landed between the HCO controller's decision
and its status write; the status event (one version later) was folded first, the patch then
looked already seen, and the KubeVirt CR never got the new CPU policy."""

from __future__ import annotations

import asyncio
import uuid

from controlplane.hco.controller import HCOController
from controlplane.loop import ControlLoop
from controlplane.writer import Writer
from events.api import hco_defaults as d
from events.jetstream.connect import connect
from events.language.messages import Command
from events.language.subjects import Layout
from projections.hco import hyperconverged
from tests.store.helpers import SyncHandler

PATCHED = {"apiVersion": d.API_VERSION, "kind": d.KIND,
           "metadata": {"name": d.DEFAULT_NAME, "namespace": d.DEFAULT_NAMESPACE},
           "spec": {"obsoleteCPUs": {"cpuModels": ["SandyBridge"]}}}


async def test_an_own_write_is_not_folded_past_a_change_not_yet_seen(
        handler: SyncHandler, nats_url: str, prefix: str) -> None:
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-loop-folding")
    writer = Writer(nc, layout)
    loop = ControlLoop(nc, layout, writer)
    hco = HCOController()
    try:
        await loop.execute(hco.reconcile(loop.state))  # create the default HyperConverged
        await loop.execute(hco.reconcile(loop.state))  # write its operands
        [status] = hco.reconcile(loop.state)
        assert status.verb == "status"
        # A client's patch lands after the decision, before the write.
        patch = await asyncio.to_thread(handler.execute, Command(
            id=str(uuid.uuid4()), actor="user:carol", kind=d.KIND, verb="apply",
            name=d.DEFAULT_NAME, manifest=PATCHED))
        assert patch.outcome.accepted, patch.outcome.reason
        await loop.execute([status])
        for sequence, event in patch.events:  # the log brings the patch to the loop
            loop.state.apply(event, sequence)
        view = hyperconverged(loop.state)
        assert view is not None and view.spec.obsolete_cpus is not None
        assert view.spec.obsolete_cpus.cpu_models == ["SandyBridge"]
        writes = {c.kind: c for c in hco.reconcile(loop.state)}
        manifest = writes["KubeVirt"].manifest
        assert manifest is not None
        assert manifest["spec"]["configuration"]["obsoleteCPUModels"]["SandyBridge"] is True
    finally:
        await nc.close()
