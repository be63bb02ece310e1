"""Every timing and limit of the control plane, named once."""

from __future__ import annotations

from typing import Final

from events.api.names import SYSTEM_ACTOR_PREFIX

NODE_MONITOR_GRACE_SECONDS: Final = 20.0
"""A node whose agent has not heartbeated for this long becomes NotReady (kube: 40s)."""
NODE_MONITOR_PERIOD_SECONDS: Final = 1.0
"""How often the node lifecycle controller looks at heartbeats."""
LOST_NODE_TOLERATION_SECONDS: Final = 6.0
"""How long the VMIs of a NotReady node, once its zone's eviction rate lets it go, tolerate
its NoExecute taint before they are failed. Kubernetes gives every pod 300 s
(DefaultTolerationSeconds); kept short here, but three heartbeat intervals: nodes lost
together cross their grace within one interval of each other, so all are NotReady, and
their zone seen disrupted, before the first one's VMIs are failed."""
EVICTION_RATE_NODES_PER_SECOND: Final = 0.1
SECONDARY_EVICTION_RATE_NODES_PER_SECOND: Final = 0.01
LARGE_CLUSTER_SIZE_THRESHOLD: Final = 50
UNHEALTHY_ZONE_THRESHOLD: Final = 0.55
"""kube-controller-manager's `--node-eviction-rate`, `--secondary-node-eviction-rate`,
`--large-cluster-size-threshold` and `--unhealthy-zone-threshold`: lost nodes of a zone are
let go one at a time at the first rate; a zone with more than two nodes and this share of
them NotReady at the second rate if it has more nodes than the threshold, else not at
all."""
HEARTBEAT_READ_WAIT_SECONDS: Final = 1.0
"""How long a node-monitor round waits for its heartbeat watch to take in every beat put
before the round began; a watch later than that judges no node this round."""
WORK_CONSUMERS_CHECK_SECONDS: Final = 5.0
"""How often the control plane looks for node work consumers that are gone (and sets them up
again), and how long it waits for the list."""
COMMAND_ACTOR_CONTROLLER: Final = f"{SYSTEM_ACTOR_PREFIX}controller"
CONTROLLER_RETRIES: Final = 10
"""Times a controller command the log could not take is sent again (backing off to 5 s)."""
CONTROL_BATCH_WAIT_SECONDS: Final = 0.05
"""How long the control loop waits for a batch of its controllers' commands to be recorded
before it decides on what came meanwhile; what is still in flight goes on, and events on its
objects wait for it."""
CONTROL_BATCHES_IN_FLIGHT: Final = 8
"""Controller batches not yet recorded, at most, before the control loop waits for one."""
INTAKE_CONCURRENCY: Final = 64
"""Commands (or reports) worked on at once; each is claimed while it is. Enough to keep the
writer's pipeline full (a command spends a few round trips and a share of a group commit
in it), few enough that the rest wait in the stream rather than in this process, where the
controllers' commands would queue behind them. On a 2-core machine, 10,000 VMs applied as
fast as they are answered: 64 gave the same largest controller lag as 32 (0.43 s each) and
all Running 4 % sooner; 50 clients' applies ran 6-9 % faster than with 32 (one client in
place of the 18 that waited in the stream). Earlier, on a machine 2.5x slower: 256 gave a
controller lag of 6.7-8.6 s, 32 gave 1.5-1.9 s, 16 cost a sixth of the throughput."""
PULL_EXPIRES_SECONDS: Final = 5.0
"""How long one of the intake's pull requests waits on the server for messages."""
PULL_TOP_UP: Final = INTAKE_CONCURRENCY // 4
"""Free places that make the intake ask for more (fewer wait for the next ask)."""
INTAKE_RETRY_SECONDS: Final = 1.0
"""How long a message the log could not take waits before it is delivered again."""
MAX_DELIVER: Final = 5
"""Deliveries of one command or report before it is dead-lettered."""
MAX_PUT_ATTEMPTS: Final = 10
"""Puts of one outcome the bucket refuses before the marker is left its only record."""
OUTCOME_PUT_TIMEOUT_SECONDS: Final = 5.0
"""How long an outcome's put waits for the bucket's ack before it is made again."""
COMMAND_AWAIT_TIMEOUT_SECONDS: Final = 30.0
TEST_DRIVER_URI: Final = "test:///default"
"""libvirt's simulated host, the agents' default; its agents keep it in
`<data dir>/hosts/<node>.xml`."""
SCHEDULER_TIE_BREAK_SEED: Final = 0
"""Seeds the scheduler's tie-break among equally scored nodes (kube-scheduler picks one at
random): the same log and seed give the same placements."""
SCORE_WEIGHT_TAINT_TOLERATION: Final = 3
SCORE_WEIGHT_NODE_AFFINITY: Final = 2
SCORE_WEIGHT_INTER_POD_AFFINITY: Final = 2
SCORE_WEIGHT_NODE_RESOURCES_FIT: Final = 1
"""kube-scheduler's default profile weights of its scoring plugins."""
MAX_NODE_SCORE: Final = 100
"""framework.MaxNodeScore: each plugin's scores are normalized to 0..100."""
CRASH_LOOP_BACKOFF_MAX_DELAY_SECONDS: Final = 300
"""KubeVirt's defaultMaxCrashLoopBackoffDelaySeconds: the longest wait before a VM whose VMIs
keep failing to start gets another."""
CRASH_LOOP_BACKOFF_MIN_INTERVAL_SECONDS: Final = 10
"""KubeVirt's minInterval of `calculateStartBackoffTime`: the first failure's base delay."""
VM_BACKOFF_CHECK_PERIOD_SECONDS: Final = 1.0
"""How often the VM controller looks for VMs whose crash-loop backoff has run out."""
REPLICA_SET_BURST_REPLICAS: Final = 250
"""KubeVirt's `controller.BurstReplicas`: the most VMIs a replica set creates or deletes in
one pass."""
FLEET_MIN_NODES: Final = 10
"""From this many simulated nodes on, `virtbus up` runs them as one fleet process
(`python -m nodeagent fleet`) rather than a process each (some 60 MB apiece)."""
DISPATCH_IN_FLIGHT: Final = 256
"""Node commands the dispatcher has published and not yet seen acknowledged, at most."""
DISPATCH_QUEUE: Final = 2048
"""Node commands the dispatcher holds queued, not yet published; past this, following the
log waits while the queue is published (a NATS that does not answer holds the dispatcher,
not the control plane's memory)."""
