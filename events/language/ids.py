"""UUIDs as the text every id in the log is: made from bytes, without the `UUID` object.

`str(uuid.uuid5(...))` costs ~10 µs and `str(uuid.uuid4())` ~6.5 µs, most of it building
and printing the object; the write path makes several a command (the event's id, its
controller command's, an object's uid). These give the same text in a third of the time.
"""

from __future__ import annotations

import hashlib
import os
from uuid import UUID


def name_uuid(namespace: UUID, name: str) -> str:
    """`str(uuid.uuid5(namespace, name))`."""
    return _text(hashlib.sha1(namespace.bytes + name.encode()).digest(), 0x50)


def random_uuid() -> str:
    """`str(uuid.uuid4())`."""
    return _text(os.urandom(16), 0x40)


def _text(raw: bytes, version: int) -> str:
    b = bytearray(raw[:16])
    b[6] = (b[6] & 0x0F) | version
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    x = b.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"
