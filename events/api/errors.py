"""Errors that cross package boundaries; each names what was wrong and the rule it broke."""

from __future__ import annotations


class VirtbusError(Exception):
    """Base for errors a person can act on."""


class InvalidSpec(VirtbusError, ValueError):
    """Input broke a rule. Nothing was changed.

    `field` is a JSON path into the submitted object (`spec.template.spec.domain.cpu.cores`),
    `rule` says what the field must satisfy, in words a person can act on.
    """

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


class NotFound(VirtbusError, LookupError):
    """The named object does not exist."""


class Forbidden(VirtbusError, PermissionError):
    """The policy does not let this user do or read that (Kubernetes' Forbidden)."""


class TooManyRequests(VirtbusError):
    """The read service refused an audit read past the asker's rate (Kubernetes' 429); ask
    again after `retry_after_seconds`."""

    def __init__(self, message: str, retry_after_seconds: int) -> None:
        self.retry_after_seconds = retry_after_seconds
        super().__init__(message)


class Conflict(VirtbusError):
    """The object changed under the writer; retry from fresh state."""
