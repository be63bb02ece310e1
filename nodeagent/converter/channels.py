"""`<channel>`s: virtio-serial ports between guest and host.

Every VMI gets the QEMU guest agent's port, `org.qemu.guest_agent.0`, as in KubeVirt
(`newGuestAgentChannel`): a unix socket whose path libvirt chooses, through which the agent
in the guest answers libvirt (guest info, fs freeze, graceful shutdown).

`spec.domain.devices.downwardMetrics: {}` gives the guest a port named
`org.github.vhostmd.1` on which vhostmd's virtio transport answers `GET /metrics/XML`;
the host end is a unix socket the metrics provider connects to, bound per VMI as the
serial console's is. Names are KubeVirt's (converter `convertDownwardMetricsChannel`);
virtbus runs no metrics provider yet, so the port exists but nobody answers on it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from nodeagent.converter import defaults
from nodeagent.converter.xmltree import child, sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_channels(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    devices = child(domain, "devices")
    guest_agent = sub(devices, "channel", type="unix")
    sub(guest_agent, "target", type="virtio", name=defaults.GUEST_AGENT_CHANNEL)
    if spec.domain.devices.downward_metrics is None:
        return
    channel = sub(devices, "channel", type="unix")
    socket = os.path.join(ctx.socket_path, defaults.DOWNWARD_METRICS_SOCKET)
    sub(channel, "source", mode="bind", path=socket)
    sub(channel, "target", type="virtio", name=defaults.DOWNWARD_METRICS_CHANNEL)
