"""Every timing and limit of the control plane, named once."""

from __future__ import annotations

from typing import Final

NODE_MONITOR_GRACE_SECONDS: Final = 20.0
"""A node whose agent has not heartbeated for this long becomes NotReady (kube: 40s)."""
NODE_MONITOR_PERIOD_SECONDS: Final = 1.0
"""How often the node lifecycle controller looks at heartbeats."""
COMMAND_ACTOR_CONTROLLER: Final = "system:controller"
INTAKE_BATCH: Final = 64
"""Commands (or reports) fetched per pull."""
COMMAND_AWAIT_TIMEOUT_SECONDS: Final = 30.0
