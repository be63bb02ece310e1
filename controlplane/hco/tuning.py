"""The `tuningPolicy` rate limits for KubeVirt's API clients.

| spec.tuningPolicy | tuningPolicy annotation    | result                                  |
|-------------------|----------------------------|-----------------------------------------|
| unset             | any                        | KubeVirt defaults (annotation ignored)  |
| annotation        | `{"qps": >0, "burst": >0}` | those values                            |
| annotation        | missing or malformed       | rejected                                |
| highBurst         | absent                     | qps 200, burst 400                      |
| highBurst         | present                    | rejected (the two would disagree)       |
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from events.api import hco_defaults as d
from events.api.errors import InvalidSpec
from events.api.hco import HyperConverged

_FIELD = "spec.tuningPolicy"


@dataclass(frozen=True)
class RateLimits:
    qps: float
    burst: int


def rate_limits(hco: HyperConverged) -> RateLimits | None:
    """The limits to give KubeVirt, `None` for its defaults; `InvalidSpec` per the table."""
    policy = hco.spec.tuning_policy
    annotation = hco.metadata.annotations.get(d.TUNING_POLICY_ANNOTATION)
    if policy == "highBurst":
        if annotation is not None:
            raise InvalidSpec(
                _FIELD,
                f"highBurst cannot be combined with the {d.TUNING_POLICY_ANNOTATION} "
                "annotation; remove the annotation or use tuningPolicy: annotation",
            )
        return RateLimits(qps=d.HIGH_BURST_QPS, burst=d.HIGH_BURST_BURST)
    if policy != "annotation":
        return None
    if annotation is None:
        raise InvalidSpec(
            _FIELD,
            f"tuningPolicy annotation requires the {d.TUNING_POLICY_ANNOTATION} annotation "
            'with {"qps": <number>, "burst": <integer>}',
        )
    return _parse_annotation(annotation)


def _parse_annotation(text: str) -> RateLimits:
    field = f"metadata.annotations[{d.TUNING_POLICY_ANNOTATION}]"
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSpec(field, f"must be a JSON object: {exc.msg}") from exc
    if not isinstance(values, dict):
        raise InvalidSpec(field, 'must be a JSON object like {"qps": 100, "burst": 200}')
    qps, burst = values.get("qps"), values.get("burst")
    if isinstance(qps, bool) or not isinstance(qps, int | float) or qps <= 0:
        raise InvalidSpec(field, "qps must be a number greater than 0")
    if isinstance(burst, bool) or not isinstance(burst, int) or burst <= 0:
        raise InvalidSpec(field, "burst must be an integer greater than 0")
    return RateLimits(qps=qps, burst=burst)
