"""Node-agent defaults, defined once; cluster-wide CPU ones are in `events.api.hco_defaults`."""

from __future__ import annotations

from typing import Final

DEVICE_PLUGIN_CAPACITY: Final = 110
"""kvm and tun devices advertised per node (seed: "an arbitrary default based on the number
of pods that node is limited to")."""
MAX_PODS: Final = 110
"""Kubernetes' default pods per node, which the device count mirrors."""
HUGEPAGE_SIZES_KIB: Final = (2048, 1048576)
"""x86 hugepage sizes reported as `hugepages-2Mi` / `hugepages-1Gi`, zero when none exist."""
