"""MessagePack (the msgpack package): JSON's data model in fewer bytes, plus bytes values."""

from __future__ import annotations

from typing import Any

from pgbroker.codecs.base import Codec, require
from pgbroker.codecs.errors import CorruptBody, EncodeError

CONTENT_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")


class MsgpackCodec(Codec):
    name = "msgpack"
    content_type = CONTENT_TYPES[0]

    def __init__(self) -> None:
        self._msgpack = require("msgpack", self.name)

    def encode(self, value: Any) -> bytes:
        try:
            data: bytes = self._msgpack.packb(value, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise EncodeError(
                f"message cannot be encoded as MessagePack: {exc}",
                hint="Send dicts, lists, strings, bytes, numbers, booleans or None.",
            ) from None
        return data

    def decode(self, data: bytes) -> Any:
        try:
            return self._msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (ValueError, TypeError, self._msgpack.UnpackException) as exc:
            raise CorruptBody(f"body is not MessagePack: {exc or type(exc).__name__}") from None
