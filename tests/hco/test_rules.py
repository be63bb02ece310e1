"""The PrometheusRule alerts on the metrics the fold exposes, by the same names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from projections.hco_metrics import (
    COMPONENT_LABEL,
    CR_MODIFIED_ALERT,
    CR_MODIFIED_SEVERITY,
    OUT_OF_BAND_MODIFICATIONS,
    UNSAFE_MODIFICATIONS,
    UNSUPPORTED_MODIFICATION_ALERT,
    UNSUPPORTED_MODIFICATION_SEVERITY,
)

RULES = Path(__file__).parents[2] / "deploy" / "prometheus" / "hco-rules.yaml"


def rules() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    assert document["apiVersion"] == "monitoring.coreos.com/v1"
    assert document["kind"] == "PrometheusRule"
    return {rule["alert"]: rule for group in document["spec"]["groups"] for rule in group["rules"]}


def test_cr_modified_rule() -> None:
    rule = rules()[CR_MODIFIED_ALERT]
    assert OUT_OF_BAND_MODIFICATIONS in rule["expr"]
    assert "[10m]" in rule["expr"]
    assert f"by ({COMPONENT_LABEL})" in rule["expr"]
    assert rule["labels"]["severity"] == CR_MODIFIED_SEVERITY


def test_unsupported_modification_rule() -> None:
    rule = rules()[UNSUPPORTED_MODIFICATION_ALERT]
    assert UNSAFE_MODIFICATIONS in rule["expr"]
    assert rule["labels"]["severity"] == UNSUPPORTED_MODIFICATION_SEVERITY
