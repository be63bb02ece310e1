"""Where a VMI's files live on this host, and the check that keeps them there.

Each VMI has its own directory under a base the agent is configured with:
`<base>/<namespace>/<name>/` (disk images and NVRAM under the disk directory, console and
metrics sockets under the run directory). The names that make those paths come from a
manifest, through a control plane that may be old or hostile, so admission refusing them
is not enough: every path the agent opens, creates or hands to libvirt for a VMI is made by
`vmi_path`, which holds whatever reached the agent.
"""

from __future__ import annotations

import os
from pathlib import Path

from events.api.errors import VirtbusError


class HostPathError(VirtbusError):
    """A VMI's names would make a path outside the VMI's own directory; nothing was opened."""


def vmi_path(base: str, namespace: str, name: str, *entries: str) -> str:
    """`<base>/<namespace>/<name>[/<entry>...]`, as joined (so a caller's paths read as the
    operator configured them), once every name in it is one path component and, with `..`,
    absolute components and symlinks resolved, the VMI's directory lies inside `base` and
    the path inside the VMI's directory. Anything else raises `HostPathError`."""
    for component in (namespace, name, *entries):
        if component in ("", ".", "..") or "/" in component or "\0" in component:
            raise HostPathError(
                f"{component!r} (VMI {namespace!r}/{name!r}) is not a file name: it must be "
                "one path component, not empty, '.' or '..'")
    own = os.path.join(base, namespace, name)
    path = os.path.join(own, *entries)
    own_resolved, resolved = Path(own).resolve(), Path(path).resolve()
    if not own_resolved.is_relative_to(Path(base).resolve()):
        raise HostPathError(f"{own} resolves to {own_resolved}, outside {base}")
    if entries and (resolved == own_resolved or not resolved.is_relative_to(own_resolved)):
        raise HostPathError(f"{path} resolves to {resolved}, outside {own_resolved}, "
                            "the VMI's own directory")
    return path
