"""Workload update commands, the workload updater's own: `evict-batch` (one batch of the
`Evict` method: its VMIs deleted and the batch recorded in one append, never sooner than
`batchEvictionInterval` after the last, never more than `batchEvictionSize`)."""

from __future__ import annotations

from typing import Final

import msgspec

from controlplane.clusterconfig import ClusterConfig
from controlplane.decision import Decision, Rejected, handles
from controlplane.vmi.commands import request_deletion
from events.language.codec import now
from events.language.kinds.migration import WORKLOAD_UPDATE_KIND, WorkloadEvictionBatch
from events.language.kinds.vm import VMI_KIND
from events.language.subjects import aggregate_id
from projections.kinds.migration import WorkloadUpdateView
from projections.kinds.vm import VirtualMachineInstanceView

KIND: Final = "WorkloadUpdate"
UPDATER_ID: Final = aggregate_id(WORKLOAD_UPDATE_KIND, "", "cluster")


class BatchBody(msgspec.Struct, frozen=True, kw_only=True):
    vmis: list[str]
    """`namespace/name` of each VMI to evict."""


@handles(KIND, "evict-batch", internal=True)
def evict_batch(d: Decision) -> None:
    refs = d.body(BatchBody).vmis
    config = ClusterConfig.of_decision(d).workload_updates
    if "Evict" not in config.methods:
        raise Rejected("the workload update strategy does not evict")
    if not refs or len(refs) > config.batch_size:
        raise Rejected(f"a batch holds 1 to batchEvictionSize ({config.batch_size}) VMIs",
                       "vmis")
    updater = d.load(UPDATER_ID, WorkloadUpdateView)
    last = updater.state.last_batch_at
    if last is not None and now() - last < config.interval:
        raise Rejected("the last batch was less than batchEvictionInterval ago")
    evicted = []
    for ref in refs:
        namespace, _, name = ref.partition("/")
        vmi = d.load(aggregate_id(VMI_KIND, namespace, name), VirtualMachineInstanceView)
        if vmi.state.active and vmi.state.deletion_requested_at is None:
            request_deletion(d, vmi)
            evicted.append(ref)
    if not evicted:
        raise Rejected("nothing left to evict")
    d.trigger(updater, WorkloadEvictionBatch, vmis=evicted)
