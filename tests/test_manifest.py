"""Manifest decoding names the field and the rule: unknown fields, names, and enum values
listed from the types themselves."""

from __future__ import annotations

from typing import Any

import pytest

import events.api.hco  # noqa: F401  (imported for its effect: registers the HyperConverged kinds)
from events.api.errors import InvalidSpec
from events.api.manifest import decode_object, parse_documents

HCO = {"apiVersion": "hco.kubevirt.io/v1beta1", "kind": "HyperConverged",
       "metadata": {"name": "kubevirt-hyperconverged"}}


@pytest.mark.parametrize(("spec", "field", "rule"), [
    ({"tuningPolicy": "fast"}, "spec.tuningPolicy",
     "must be one of annotation, highBurst, not 'fast'"),
    ({"workloadUpdateStrategy": {"workloadUpdateMethods": ["Teleport"]}},
     "spec.workloadUpdateStrategy.workloadUpdateMethods[0]",
     "must be one of Evict, LiveMigrate, not 'Teleport'"),
    ({"evictionStrategy": "Maybe"}, "spec.evictionStrategy",
     "must be one of External, LiveMigrate, LiveMigrateIfPossible, None, not 'Maybe'"),
    ({"liveMigrationConfig": {"parallelMigrations": 3}}, "spec.liveMigrationConfig",
     "Object contains unknown field `parallelMigrations`"),
])
def test_errors_name_the_field_and_the_rule(spec: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        decode_object({**HCO, "spec": spec})
    assert (refused.value.field, refused.value.rule) == (field, rule)


def test_yaml_that_does_not_parse_names_its_source() -> None:
    with pytest.raises(InvalidSpec, match=r"^vm\.yaml: must be valid YAML"):
        parse_documents("kind: [unclosed", "vm.yaml")
    with pytest.raises(InvalidSpec, match=r"^vm.yaml\[1\]: each document must be a mapping"):
        parse_documents("kind: A\n---\n- a list\n", "vm.yaml")
