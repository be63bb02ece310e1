"""TLS security profiles: which profile applies, and how each operand receives it.

CDI, CNAO and SSP take the OpenShift `TLSSecurityProfile` stanza as is. KubeVirt takes
`tlsConfiguration` (minimum version plus IANA cipher names), so the OpenSSL names of the
profile are translated; names with no Go equivalent (TLS 1.3 suites, DHE) are dropped, as
library-go's `OpenSSLToIANACipherSuites` does.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from events.api import hco_defaults as d
from events.api.hco import HyperConvergedSpec, TLSProfileSpec, TLSSecurityProfile

_TLS13 = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
_INTERMEDIATE_TLS12 = (
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
    "DHE-RSA-AES128-GCM-SHA256",
    "DHE-RSA-AES256-GCM-SHA384",
)

# The predefined profiles (Mozilla recommendations, as openshift/api ships them).
PROFILES: Final[dict[str, TLSProfileSpec]] = {
    "Old": TLSProfileSpec(
        ciphers=[
            *_TLS13,
            *_INTERMEDIATE_TLS12,
            "DHE-RSA-CHACHA20-POLY1305",
            "ECDHE-ECDSA-AES128-SHA256",
            "ECDHE-RSA-AES128-SHA256",
            "ECDHE-ECDSA-AES128-SHA",
            "ECDHE-RSA-AES128-SHA",
            "ECDHE-ECDSA-AES256-SHA384",
            "ECDHE-RSA-AES256-SHA384",
            "ECDHE-ECDSA-AES256-SHA",
            "ECDHE-RSA-AES256-SHA",
            "DHE-RSA-AES128-SHA256",
            "DHE-RSA-AES256-SHA256",
            "AES128-GCM-SHA256",
            "AES256-GCM-SHA384",
            "AES128-SHA256",
            "AES256-SHA256",
            "AES128-SHA",
            "AES256-SHA",
            "DES-CBC3-SHA",
        ],
        min_tls_version="VersionTLS10",
    ),
    "Intermediate": TLSProfileSpec(
        ciphers=[*_TLS13, *_INTERMEDIATE_TLS12], min_tls_version="VersionTLS12"
    ),
    "Modern": TLSProfileSpec(ciphers=list(_TLS13), min_tls_version="VersionTLS13"),
}

_OPENSSL_TO_IANA: Final = {
    "ECDHE-ECDSA-AES128-GCM-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384": "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "ECDHE-RSA-CHACHA20-POLY1305": "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "ECDHE-ECDSA-AES128-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "ECDHE-RSA-AES128-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "ECDHE-ECDSA-AES128-SHA": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "ECDHE-RSA-AES128-SHA": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "ECDHE-ECDSA-AES256-SHA": "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "ECDHE-RSA-AES256-SHA": "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "AES128-GCM-SHA256": "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "AES256-GCM-SHA384": "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "AES128-SHA256": "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "AES128-SHA": "TLS_RSA_WITH_AES_128_CBC_SHA",
    "AES256-SHA": "TLS_RSA_WITH_AES_256_CBC_SHA",
    "DES-CBC3-SHA": "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
}
_KUBEVIRT_TLS_VERSIONS: Final = ("VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13")


def effective_profile(spec: HyperConvergedSpec) -> TLSSecurityProfile:
    """The spec's profile, or Intermediate: on plain Kubernetes there is no APIServer CR."""
    if spec.tls_security_profile is not None:
        return spec.tls_security_profile
    return TLSSecurityProfile(type=d.TLS_SECURITY_PROFILE_TYPE, intermediate={})


def profile_json(spec: HyperConvergedSpec) -> dict[str, Any]:
    """The stanza CDI, CNAO and SSP take unchanged."""
    encoded: dict[str, Any] = msgspec.to_builtins(effective_profile(spec))
    return encoded


def kubevirt_tls_configuration(spec: HyperConvergedSpec) -> dict[str, Any]:
    """KubeVirt's `tlsConfiguration`: IANA cipher names and a TLS version it knows."""
    profile = effective_profile(spec)
    settings = profile.custom if profile.custom is not None else PROFILES[profile.type]
    version = settings.min_tls_version
    return {
        "minTLSVersion": version if version in _KUBEVIRT_TLS_VERSIONS else "VersionTLS12",
        "ciphers": [_OPENSSL_TO_IANA[c] for c in settings.ciphers if c in _OPENSSL_TO_IANA],
    }
