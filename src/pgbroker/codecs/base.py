"""What a codec is: a name, a content type, and bytes from a value and back.

A codec's ``name`` is what callers, queue policies and Spark options say ("json", "msgpack",
"protobuf:shop.Order", "avro:shop.Order"); its ``content_type`` is what travels beside the bytes
(a broker's message property, the stored envelope). Optional libraries are imported only when a
codec that needs them is made (require()).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from types import ModuleType
from typing import Any

from pgbroker.codecs.errors import CodecNotInstalled

EXTRA = "codecs"


class Codec(ABC):
    """Turns a value into bytes and back. Subclasses set ``name`` and ``content_type``."""

    name: str
    content_type: str

    @abstractmethod
    def encode(self, value: Any) -> bytes:
        """The value's bytes, or EncodeError naming what the codec cannot take."""

    @abstractmethod
    def decode(self, data: bytes) -> Any:
        """The value in ``data``, or CorruptBody saying why it cannot be read."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def require(module: str, codec: str) -> ModuleType:
    """Import an optional library, or CodecNotInstalled naming the extra that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise CodecNotInstalled(
            f"the {codec} codec needs the Python package {module.split('.')[0]!r}, which is not installed "
            f"({exc})",
            hint=f"pip install 'pgbroker[{EXTRA}]'",
        ) from None


def parse_content_type(content_type: str) -> tuple[str, dict[str, str]]:
    """('type/subtype' lower-cased, {parameter (lower-cased): value}) of a Content-Type value."""
    media, *params = content_type.split(";")
    found: dict[str, str] = {}
    for param in params:
        key, sep, value = param.partition("=")
        if sep:
            found[key.strip().lower()] = value.strip().strip('"')
    return media.strip().lower(), found
