"""Node-agent defaults, defined once; cluster-wide CPU ones are in `events.api.hco_defaults`."""

from __future__ import annotations

from importlib.metadata import version
from typing import Final

AGENT_VERSION: Final = version("virtbus")
"""What an agent reports as its version unless told otherwise (`--agent-version`)."""
DEVICE_PLUGIN_CAPACITY: Final = 110
"""kvm and tun devices advertised per node (seed: "an arbitrary default based on the number
of pods that node is limited to")."""
MAX_PODS: Final = 110
"""Kubernetes' default pods per node, which the device count mirrors."""
HUGEPAGE_SIZES_KIB: Final = (2048, 1048576)
"""x86 hugepage sizes reported as `hugepages-2Mi` / `hugepages-1Gi`, zero when none exist."""
TEST_DRIVER_SCHEME: Final = "test://"
"""libvirt's test driver: a `--libvirt-uri` of this scheme makes the agent's host a simulated
one (`nodeagent.simhost`)."""
TEST_DEFAULT_URI: Final = "test:///default"
"""The default `--libvirt-uri`, and the one `--sim-state` goes with: the test driver, its host
in the file (an empty `<node>` has test:///default's CPUs and memory, without its sample
domain and NUMA cells, which no agent uses)."""
TEST_HOST_CPU_MODEL: Final = "Haswell-noTSX"
"""The CPU a test-driver host reports, so its node carries CPU model and feature labels (the
test driver names no CPU of its own); `--host-cpu-model` overrides it."""
REDISCOVERY_INTERVAL_SECONDS: Final = 60.0
"""How often the agent looks at its host again; it reports only when the fingerprint changed."""
DOWNWARD_METRICS_INTERVAL_SECONDS: Final = 5.0
"""How often the agent rewrites each downwardMetrics disk (KubeVirt's
DownwardmetricsRefreshDuration)."""
READ_SERVICE_WAIT_SECONDS: Final = 30.0
"""How long a starting agent waits for the read service to say which VMIs are its own."""
READ_SERVICE_RETRY_SECONDS: Final = 0.5
DOMAIN_MISSING_REASON: Final = "domain missing after agent restart"
WORKLOG_POLL_SECONDS: Final = 0.1
"""How often a starting agent looks again for the applied-work bucket the control plane
creates with the installation."""
FETCH_WAIT_SECONDS: Final = 1.0
"""How long one pull for node work waits on the server before the agent looks at its stop
and its silence again."""
SIMULATED_BANDWIDTH_BYTES_PER_SECOND: Final = 125_000_000
"""The link a test-driver agent's simulated migrations go over: 1 Gbit/s, so a 1Gi guest
takes some 9 s and its progress can be watched (`--sim-migration-bandwidth`)."""
SIMULATED_DIRTY_RATE_BYTES_PER_SECOND: Final = 0
"""How fast a guest dirties its memory in a simulated migration, unless its VMI says
otherwise (`virtbus.io/simulated-dirty-rate`): an idle guest (`--sim-dirty-rate`)."""
MIGRATION_REPORT_INTERVAL_SECONDS: Final = 1.0
"""How often the source steps a simulated transfer and reports its progress (KubeVirt's
migration monitor polls libvirt's job stats every 400 ms; a report a second is enough for a
status that shows progress)."""
SOURCE_RESTARTED_REASON: Final = "source agent restarted"
"""Why a migration the source was transferring when its agent stopped has failed."""
HYPERVISOR_PROBE_SECONDS: Final = 5.0
"""How long the KVM probe (`nodeagent.hypervisor`) may take before KVM counts as not running
guests; a working KVM answers in milliseconds."""
IMAGE_DIR: Final = "/var/lib/virtbus/images"
"""The node's image store (`nodeagent.imagestore`): `<dir>/<reference, percent-encoded>/`
holds an image's files, its disk in `disk/`."""
FLEET_NODE_PREFIX: Final = "node-"
"""A fleet's nodes are `node-<first>`, `node-<first+1>`, ...: as `virtbus up` names agents."""
FLEET_LIBVIRT_THREADS: Final = 16
"""Threads a fleet lends its agents for libvirt calls (one pool for every node: a test-driver
call is short, and a node's calls take turns on its own connection anyway)."""
FLEET_RESTART_SECONDS: Final = 1.0
"""How long a fleet waits before it starts again a node agent that failed."""
BRIDGE: Final = "vb-br0"
"""The bridge a real host's guests are on (`--bridge`; `nodeagent.network`)."""
POD_SUBNET: Final = "10.0.2.0/24"
"""The guests' subnet on the bridge (`--pod-subnet`): the gateway is its first address, the
first guest gets the second, 10.0.2.1 and 10.0.2.2 as in KubeVirt's masquerade binding."""
NETWORK_DIR: Final = "/var/lib/virtbus/network"
"""Where the agent keeps each bridge's guest interfaces and its dnsmasq's files
(`<dir>/<bridge>/`)."""
INTERFACES_POLL_SECONDS: Final = 1.0
"""How often the agent looks at the DHCP leases for guests' addresses to report."""
STOP_RETRY_SECONDS: Final = 2.0
"""How long a stop libvirt failed waits before it is tried again (the work item comes back,
up to the node stream's `max_deliver`): the guest may still run, as virt-handler re-queues."""
