"""Node: its command handlers (`commands`: register, Ready / NotReady, label, taint, cordon)
and the node lifecycle controller that turns heartbeats into transitions (`controller`)."""
