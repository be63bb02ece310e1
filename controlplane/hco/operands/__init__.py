"""The operand registry: adding an operand is one module and one entry here."""

from __future__ import annotations

from controlplane.hco.operands.base import ClusterInfo, Operand
from controlplane.hco.operands.cdi import CDI
from controlplane.hco.operands.cna import CNA
from controlplane.hco.operands.kubevirt import KUBEVIRT
from controlplane.hco.operands.ssp import SSP

OPERANDS: tuple[Operand, ...] = (KUBEVIRT, CDI, CNA, SSP)

__all__ = ["OPERANDS", "ClusterInfo", "Operand"]
