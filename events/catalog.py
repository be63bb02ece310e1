"""Every module that defines event types. The codec imports this on first need, so a reader
can decode any stored event without knowing which module defined it."""

from __future__ import annotations

import events.hco
import events.instancetype
import events.messages
import events.migration
import events.nodes
import events.vm

MODULES = (events.messages, events.nodes, events.vm, events.hco, events.migration,
           events.instancetype)
