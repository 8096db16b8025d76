"""Importing the modules that make codecs known to a process that only runs pgbroker's code (the
CLI, the HTTP server): a module that calls register(AvroCodec(schema)), or the module protoc
generated for a Protobuf type (importing it puts the type in the default descriptor pool)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from pgbroker.codecs.errors import CodecError


def import_codec_modules(names: Iterable[str]) -> None:
    """Import each module named (dotted, importable from sys.path), or say which one failed."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise CodecError(
                f"cannot import codec module {name!r}: {exc}",
                hint="Give a dotted module name importable here (on PYTHONPATH), for example "
                "shop.schemas; it registers its codecs when imported.",
            ) from exc
