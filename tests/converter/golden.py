"""The golden cases: `golden/<case>.yaml` in, `golden/<case>.xml` out."""

from __future__ import annotations

import pathlib

import yaml

from nodeagent.domxml import render_manifest

GOLDEN_DIR = pathlib.Path(__file__).parent / "golden"
CASES = sorted(path.stem for path in GOLDEN_DIR.glob("*.yaml"))
CLUSTER_DEFAULT_CPU_MODEL = {
    "cpu-cluster-default": "EPYC",
    "cpu-model-overrides-cluster-default": "EPYC",
}
"""Cases rendered as if the HyperConverged CR set `defaultCPUModel`."""


def render_case(case: str) -> str:
    """Render a golden input for libvirt's test driver, which needs `type='test'`."""
    doc = yaml.safe_load((GOLDEN_DIR / f"{case}.yaml").read_text())
    return render_manifest(
        doc,
        domain_type="test",
        default_cpu_model=CLUSTER_DEFAULT_CPU_MODEL.get(case, ""),
    )


def expected_xml(case: str) -> str:
    return (GOLDEN_DIR / f"{case}.xml").read_text()
