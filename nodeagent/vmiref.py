"""Which VMI a guest is: what the agent and its migrations both name guests by."""

from __future__ import annotations

import msgspec

from nodeagent.converter.context import domain_name


class VMIRef(msgspec.Struct, frozen=True):
    namespace: str
    name: str
    uid: str

    @property
    def domain(self) -> str:
        return domain_name(self.namespace, self.name)
