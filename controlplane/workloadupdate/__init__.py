"""Workload updates: after an agent upgrade, the VMIs its older version launched are moved by
the `workloadUpdateStrategy` (its `commands` and its `controller`)."""
