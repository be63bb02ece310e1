"""Serial console: a unix socket the agent can attach to, unless the spec opts out.

KubeVirt's `autoattachSerialConsole` defaults on; it binds serial port 0 to a socket
and mirrors it as the domain console. With `ConverterContext.serial_log` (the agent's, on a
real host) virtlogd also writes what the guest prints to `<socket>-log`, as KubeVirt's
serial console log does (`<log file='.../virt-serial0-log' append='on'/>`), so the output
is kept whether or not anyone is attached.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from nodeagent.converter.xmltree import child, sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element

SERIAL_SOCKET = "virt-serial0"
SERIAL_LOG = f"{SERIAL_SOCKET}-log"


def configure_console(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    if spec.domain.devices.autoattach_serial_console is False:
        return
    devices = child(domain, "devices")
    serial = sub(devices, "serial", type="unix")
    sub(serial, "source", mode="bind", path=os.path.join(ctx.socket_path, SERIAL_SOCKET))
    sub(serial, "target", port=0)
    if ctx.serial_log:
        sub(serial, "log", file=os.path.join(ctx.socket_path, SERIAL_LOG), append="on")
    console = sub(devices, "console", type="pty")
    sub(console, "target", type="serial", port=0)
