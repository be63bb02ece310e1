"""Kinds and event types are known whatever a process imported first: the declarations and
the language's words are found by their packages, not listed, so none is missing because a
reader happened not to import the module that holds it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json
{first}
from events.api.kinds import declared
from events.language.codec import event_class
types = [event_class(name).TYPE for name in
         ("ReplicaSetApplied", "VirtualMachineInstancePresetApplied", "OperandApplied",
          "ControllerRevisionCreated", "ObjectApplied", "CommandAccepted")]
print(json.dumps([[k.kind for k in declared()], types]))
"""


def probe(first: str) -> list[list[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(first=first)], check=True,
                          capture_output=True, text=True, timeout=60)
    result: list[list[str]] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("first", ["", "import events.language.codec",
                                   "import events.api.manifest", "import events.api.vm"])
def test_with_only_events_imported_every_kind_and_event_type_is_known(first: str) -> None:
    kinds, types = probe(first)
    assert {"VirtualMachine", "VirtualMachineInstanceReplicaSet", "HyperConverged", "Node",
            "VirtualMachineClusterPreference", "ControllerRevision"} <= set(kinds)
    assert len(kinds) == len(set(kinds)) == 16
    assert types == ["ReplicaSetApplied", "VirtualMachineInstancePresetApplied",
                     "OperandApplied", "ControllerRevisionCreated", "ObjectApplied",
                     "CommandAccepted"]


def test_the_order_of_the_kinds_does_not_depend_on_what_was_imported_first() -> None:
    assert probe("import events.api.virtualmachines")[0] == probe("import events.api.hco")[0]
