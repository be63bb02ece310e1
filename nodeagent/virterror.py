"""Classifying libvirt errors, so callers branch on what went wrong rather than on messages."""

from __future__ import annotations

import libvirt


def is_unsupported(err: libvirt.libvirtError) -> bool:
    """The driver lacks this API (the test driver lacks several); callers fall back."""
    return bool(err.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT)


def is_unsupported_flags(err: libvirt.libvirtError) -> bool:
    """The driver has the API but refuses these flags (the test driver starts nothing paused)."""
    return bool(err.get_error_code() == libvirt.VIR_ERR_INVALID_ARG)


def is_no_domain(err: libvirt.libvirtError) -> bool:
    """The domain is gone, which stop paths treat as already done."""
    return bool(err.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN)


def quiet_libvirt_errors() -> None:
    """Stop libvirt printing every error to stderr; they arrive as exceptions and are handled."""
    libvirt.registerErrorHandler(_ignore, None)


def _ignore(_ctx: object, _err: object) -> None:
    """libvirt's error handler signature; the exception carries the error."""
