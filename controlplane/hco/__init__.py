"""The HyperConverged operator's pure core: validation, operand derivation, status.

No I/O here: the controller feeds in the HyperConverged and what it observed, and gets back
what to write. See README.md for the decision tables.
"""
