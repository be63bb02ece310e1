"""Classifying libvirt errors, so callers branch on what went wrong rather than on messages."""

from __future__ import annotations

import libvirt


def is_unsupported(err: libvirt.libvirtError) -> bool:
    """The driver lacks this API (the test driver lacks several); callers fall back."""
    return bool(err.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT)


def is_no_domain(err: libvirt.libvirtError) -> bool:
    """The domain is gone, which stop paths treat as already done."""
    return bool(err.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN)
