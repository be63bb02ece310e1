"""The `console` query: a page of a VMI's serial console, for those the policy lets read it.

Node agents publish what their real guests write on the serial console to the console stream
(`nodeagent.console`), one subject per node and VMI instance. Nobody but the read service
reads that stream: a console may show what a guest prints of its secrets, so the read
service serves it only to an asker the policy grants a `get` of KubeVirt's
`virtualmachineinstances/console` subresource in the VMI's namespace, and only the output
of the VMI's current instance on the node the cluster placed it on (another node cannot
speak for it: its agent may publish only under its own node). A deleted VMI's last instance
stays readable while the stream keeps its output
(`events.jetstream.streams.CONSOLE_RETENTION`), as its
events stay readable by `history`: what a guest printed before it powered off is what one
wants to read once it did.
"""

from __future__ import annotations

from typing import Final

from nats.aio.client import Client

from events.api.names import NODE_ACTOR_PREFIX
from events.authorization.policy import Policy, console_request
from events.jetstream.directget import direct_batch, sequence
from events.language.kinds.vm import VMI_KIND
from events.language.query import ConsoleAnswer, ConsoleQuery
from events.language.subjects import Layout, aggregate_id
from projections.cluster import ClusterState
from projections.kinds.vm import VirtualMachineInstanceView

CONSOLE_PAGE: Final = 64
"""Console messages one answer holds: 512 KiB at most
(`events.jetstream.streams.CONSOLE_CHUNK_BYTES`),
under NATS's default 1 MiB payload."""


class ConsoleRefused(Exception):
    """A console query refused: `forbidden` for the policy's refusals, else why not."""

    def __init__(self, message: str, *, forbidden: bool = False) -> None:
        self.forbidden = forbidden
        super().__init__(message)


async def console_page(nc: Client, layout: Layout, state: ClusterState, policy: Policy, *,
                       asker: str, query: ConsoleQuery) -> ConsoleAnswer:
    """The VMI's console output from `query.since`, as the asker may read it."""
    request = console_request(query.namespace)
    if asker.startswith(NODE_ACTOR_PREFIX) or not policy.allows(asker, request):
        raise ConsoleRefused(f"forbidden: User {asker!r} {request}", forbidden=True)
    vmi = state.views.get(aggregate_id(VMI_KIND, query.namespace, query.name))
    if not isinstance(vmi, VirtualMachineInstanceView) or not vmi.uid:
        raise ConsoleRefused(
            f'virtualmachineinstance "{query.namespace}/{query.name}" not found')
    if not vmi.node:
        raise ConsoleRefused(f"VMI {query.name} has no console yet: it is {vmi.phase or 'new'}"
                             " and runs on no node")
    subject = layout.console_subject(vmi.node, query.namespace, query.name, vmi.uid)
    msgs = await direct_batch(nc, layout.console_stream, max(query.since, 1), CONSOLE_PAGE,
                              subject)
    return ConsoleAnswer(output=b"".join(m.data for m in msgs),
                         next=sequence(msgs[-1]) + 1 if msgs else max(query.since, 1),
                         more=len(msgs) == CONSOLE_PAGE, phase=vmi.phase)
