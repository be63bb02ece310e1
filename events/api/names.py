"""Kubernetes' rules for names: DNS-1123 labels (namespaces, most of KubeVirt's objects,
volume names) and subdomains (instancetypes, label prefixes), each with the wording a
refusal names; and the user names Kubernetes reserves (`system:`, `system:node:<node>`)."""

from __future__ import annotations

import re
from typing import Final

from events.api.errors import InvalidSpec

SYSTEM_ACTOR_PREFIX: Final = "system:"
"""Actors of the control plane's own commands; never accepted from the command stream."""
NODE_ACTOR_PREFIX: Final = f"{SYSTEM_ACTOR_PREFIX}node:"
"""A node agent's identity, as Kubernetes names a kubelet."""

DNS1123_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
"""Kubernetes' name pattern (without its 63-character limit); such names are subject-safe."""
DNS1123_LABEL_MAX: Final = 63
DNS1123_LABEL_RULE: Final = (
    f"must be a DNS-1123 label: at most {DNS1123_LABEL_MAX} lower-case letters, digits or "
    "'-', starting and ending with a letter or digit"
)
DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS1123_SUBDOMAIN_MAX: Final = 253
DNS1123_SUBDOMAIN_RULE: Final = (
    f"must be a DNS-1123 subdomain: at most {DNS1123_SUBDOMAIN_MAX} characters, DNS-1123 "
    "labels joined by '.'"
)


def check_dns1123_label(field: str, value: str) -> None:
    if not value:
        raise InvalidSpec(field, "is required")
    if len(value) > DNS1123_LABEL_MAX or not DNS1123_LABEL.fullmatch(value):
        raise InvalidSpec(field, DNS1123_LABEL_RULE)


def check_dns1123_subdomain(field: str, value: str) -> None:
    """Most Kubernetes objects' names (`u1.medium`): labels joined by dots."""
    if not value:
        raise InvalidSpec(field, "is required")
    if len(value) > DNS1123_SUBDOMAIN_MAX or not DNS1123_SUBDOMAIN.fullmatch(value):
        raise InvalidSpec(field, DNS1123_SUBDOMAIN_RULE)
