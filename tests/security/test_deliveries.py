"""Where each identity may send what the server then delivers, on the shipped accounts.conf:

- a consumer publishes its deliveries in the account of its stream, on the subject its
  creator named in the request's body, past every permission; a cluster-admin's consumer on
  the log, aimed at a person's outcome key while that person awaited it, stored copies of
  events in the outcomes bucket (and handed them to her as her outcome). No person creates
  a consumer;
- a node agent made its own work consumer, and the create subject pins its name and filter
  but not its body: `node-n1` could have made it a push consumer publishing n1's work onto
  alice's outcome key. The control plane makes each node's pull consumer; agents create and
  update none, and only bind and pull;
- a node agent could publish into any inbox (another node's, a person's); it now publishes
  only into the inboxes of those who may send it simulation requests, and the read service
  only into the control plane's.
"""

from __future__ import annotations

from functools import partial

import msgspec
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig

from controlplane.controllers.dispatcher import WorkConsumers
from events.authorization.accounts import CONTROLPLANE_USER, PROJECTIONS_USER
from events.jetstream.directget import read_all
from events.jetstream.streams import work_consumer
from tests.security.conftest import WEB, Refusals, Store, refused
from tests.system.harness import eventually


@pytest.mark.parametrize("stream", ["events", "read snapshots"])
async def test_a_cluster_admin_makes_no_consumer_deliver_into_the_store(
        store: Store, stream: str) -> None:
    """`operator` reads the whole log, by Direct Get; a push consumer of its own, aimed at
    alice's outcome key while she waits on it, is refused by the server, so nothing lands
    in the outcomes bucket."""
    layout = store.layout
    name = layout.events_stream if stream == "events" else layout.read_snapshots_stream
    cp, _ = await store.connect(CONTROLPLANE_USER)
    alice, _ = await store.connect("alice")
    awaited = f"$KV.{layout.outcomes_bucket}.alice.c1"
    waiting = await alice.subscribe(awaited)  # as her client awaits a command's outcome
    await alice.flush()
    before = await store.stored(cp)

    operator, refusals = await store.connect("operator")
    [event] = await read_all(operator, layout.events_stream, layout.aggregate_subject(WEB))
    assert event.data == b"{}"
    copier = ConsumerConfig(name="copier", deliver_subject=awaited,
                            ack_policy=AckPolicy.NONE)
    js = operator.jetstream(timeout=2)
    await refused(refusals, f"$JS.API.CONSUMER.CREATE.{name}.copier",
                  partial(js.add_consumer, name, copier))
    follow = partial(js.subscribe, layout.events_filter(), ordered_consumer=True)
    await refused(refusals, f"$JS.API.CONSUMER.CREATE.{layout.events_stream}", follow)
    assert await store.stored(cp) == before
    assert waiting.pending_msgs == 0


async def test_a_node_agent_makes_its_work_consumer_deliver_nowhere(store: Store) -> None:
    """`node-n1` tries to make its work consumer a push consumer aimed at alice's outcome key
    while she waits on it: before the control plane has made it, and after (an update); the
    server refuses both, the consumer stays the control plane's pull consumer, n1 still
    pulls its work from it, and nothing reaches alice or the outcomes bucket."""
    layout = store.layout
    stream, name = layout.node_stream, work_consumer("n1")
    cp, _ = await store.connect(CONTROLPLANE_USER)
    alice, _ = await store.connect("alice")
    awaited = f"$KV.{layout.outcomes_bucket}.alice.c1"
    waiting = await alice.subscribe(awaited)  # as her client awaits a command's outcome
    await alice.flush()
    before = await store.stored(cp)

    n1, refusals = await store.connect("node-n1")
    js = n1.jetstream(timeout=2)
    push = ConsumerConfig(name=name, durable_name=name, filter_subject=layout.node_filter("n1"),
                          deliver_subject=awaited, ack_policy=AckPolicy.EXPLICIT)
    create = f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{layout.node_filter('n1')}"
    await refused(refusals, create, partial(js.add_consumer, stream, push))
    await WorkConsumers(cp, layout).ensure("n1")  # the control plane makes it
    await refused(refusals, create, partial(js.add_consumer, stream, push))  # an update
    legacy = f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{name}"
    body = msgspec.json.encode({"stream_name": stream, "config": push.as_dict()})
    await refused(refusals, legacy, partial(n1.request, legacy, body, timeout=1))

    await cp.jetstream().publish(layout.node_subject("n1", "launch"), b"n1's work")
    info = await cp.jetstream().consumer_info(stream, name)
    assert info.config.deliver_subject is None and info.config.max_deliver is not None
    [work] = await (await js.pull_subscribe_bind(durable=name, stream=stream)).fetch(1, timeout=5)
    assert work.data == b"n1's work"
    await work.ack_sync()
    await alice.flush()
    assert waiting.pending_msgs == 0
    assert await store.stored(cp) == before


async def _refused_publish(nc: Client, refusals: Refusals, subject: str) -> None:
    """`nc`'s publish to `subject` is dropped by the server, which says so."""
    await nc.publish(subject, b"forged")
    await nc.flush()
    expected = f'permissions violation for publish to "{subject}"'.lower()

    async def said() -> bool:
        return any(expected in r.lower() for r in refusals)

    await eventually(said, timeout=10, what=f"the server's refusal of {subject}")


async def test_nobody_publishes_into_an_inbox_that_is_not_its_askers(store: Store) -> None:
    """A node agent answers only the simulation requests of those who may send them: n2
    cannot deliver into n1's inbox or alice's; the read service answers only into the
    control plane's inbox (and the `_R_.` replies imports map), never into a person's."""
    n1, _ = await store.connect("node-n1")
    alice, _ = await store.connect("alice")
    targets = {"node-n1": "_INBOX.node-n1.AbCdEf.1", "alice": "_INBOX.alice.AbCdEf.1"}
    arrivals = {"node-n1": await n1.subscribe(targets["node-n1"]),
                "alice": await alice.subscribe(targets["alice"])}
    await n1.flush()
    await alice.flush()

    n2, n2_refusals = await store.connect("node-n2")
    for target in targets.values():
        await _refused_publish(n2, n2_refusals, target)
    projections, projections_refusals = await store.connect(PROJECTIONS_USER)
    await _refused_publish(projections, projections_refusals, targets["alice"])
    await n1.flush()
    await alice.flush()
    assert [sub.pending_msgs for sub in arrivals.values()] == [0, 0]

    # What each must still do: n2 answers the operator's simulation requests.
    await n2.publish("_INBOX.operator.AbCdEf.1", b"domains")
    await n2.flush()
    assert not any("_inbox.operator" in r.lower() for r in n2_refusals)
