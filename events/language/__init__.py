"""The log's language: event and command types, the codec, subject names, and every kind's
events (`events.language.kinds`).

Importing any part of the language imports every module that defines event types (the
commands' `messages` and each module of `kinds`), so a reader decodes any stored event
without knowing which module defined it, and nothing lists those modules by hand."""

from events.language import kinds, messages

__all__ = ["kinds", "messages"]
