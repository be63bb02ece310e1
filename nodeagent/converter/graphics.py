"""`<graphics>` and `<video>`: a VNC-reachable VGA card unless the VMI is headless.

`autoattachGraphicsDevice: false` drops both (a headless VMI). VNC listens on a unix
socket in the VMI's socket directory, as KubeVirt's does, for the agent to proxy.
`devices.video.type` chooses the model in place of VGA, with the same memory and one head.
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

VNC_SOCKET = "virt-vnc"


def configure_graphics(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    if spec.domain.devices.autoattach_graphics_device is False:
        return
    devices = child(domain, "devices")
    graphics = sub(devices, "graphics", type="vnc")
    sub(graphics, "listen", type="socket", socket=os.path.join(ctx.socket_path, VNC_SOCKET))
    video = sub(devices, "video")
    chosen = spec.domain.devices.video
    model = chosen.type if chosen is not None and chosen.type else defaults.VIDEO_MODEL
    sub(video, "model", type=model, vram=defaults.VIDEO_VRAM_KIB, heads=1)
