"""The HyperConverged operator: its command handlers (`commands`), its controller
(`controller`), and its pure core (validation, operand derivation, status).

The core does no I/O: the controller feeds in the HyperConverged and what it observed, and
gets back what to write. See README.md for the decision tables.
"""
