"""Node maintenance: `drain` (its command handlers in `commands`) and the evacuation
controller that empties a draining node by each VMI's eviction strategy (`controller`)."""
