"""VirtualMachineInstancePreset: its command handlers and how presets fill a VMI at its
creation (`commands`). Presets have no controller: KubeVirt applied them in its mutating
webhook, once, when a VMI is created, and so here in each VMI creation's decision."""
