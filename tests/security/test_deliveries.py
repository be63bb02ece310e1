"""Where each identity may send what the server then delivers, on the shipped accounts.conf:

- a consumer publishes its deliveries in the account of its stream, on the subject its
  creator named in the request's body, past every permission; a cluster-admin's consumer on
  the log, aimed at a person's outcome key while that person awaited it, stored copies of
  events in the outcomes bucket (and handed them to her as her outcome). No person creates
  a consumer;
- a node agent could publish into any inbox (another node's, a person's); it now publishes
  only into the inboxes of those who may send it simulation requests, and the read service
  only into the control plane's.
"""

from __future__ import annotations

from functools import partial

import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig

from events.authorization import CONTROLPLANE_USER, PROJECTIONS_USER
from events.directget import read_all
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
