"""The errors of pgbroker.codecs: every one names what was wrong and how to fix it.

All are PgbrokerError (and CodecError); those about a value or a body are InvalidMessage too, so
a caller that already catches InvalidMessage for bad JSON catches them.
"""

from __future__ import annotations

from pgbroker.errors import InvalidMessage, PgbrokerError


class CodecError(PgbrokerError):
    """Base class: a message body could not be encoded, decoded, or its codec found."""


class UnknownCodec(CodecError, ValueError):
    """No codec by that name or content type: misspelt, or a Protobuf/Avro codec not registered."""


class CodecNotInstalled(CodecError, ImportError):
    """The library a codec needs is not installed (pip install 'pgbroker[codecs]')."""


class EncodeError(CodecError, InvalidMessage):
    """The value cannot be encoded by the codec chosen (wrong type, not matching the schema, ...)."""


class CorruptBody(CodecError, InvalidMessage):
    """Stored or received bytes cannot be decoded: a damaged envelope, or bytes of another type."""
