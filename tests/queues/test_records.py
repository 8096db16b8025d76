"""The records a read makes for every message, built fast (pgbroker._frozen.builder): instances of
their class like any other, equal, hashed and frozen alike; and the builder takes only the classes
it can build without their constructor."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass
from datetime import UTC, datetime

import pytest

from pgbroker._frozen import builder
from pgbroker.queues._records import Message, Receipt, build_message
from pgbroker.streams._records import StreamMessage, build_stream_message

NOW = datetime(2026, 11, 28, tzinfo=UTC)


def test_a_built_record_is_one_of_its_class_and_as_frozen() -> None:
    receipt = Receipt.issued("7:2:1764288000000000")
    assert type(receipt) is Receipt
    assert receipt == Receipt(7, 2, 1764288000000000)
    assert hash(receipt) == hash(Receipt(7, 2, 1764288000000000))
    fields = (7, 2, NOW, NOW, NOW, {"n": 1}, None, receipt, "json", None)
    message = build_message(*fields)
    assert type(message) is Message
    assert message == Message(*fields)
    assert repr(message) == repr(Message(*fields))
    with pytest.raises(FrozenInstanceError):
        message.read_ct = 3  # type: ignore[misc]
    stream_message = build_stream_message("s", 0, 1, 1, "k", NOW, None, {"n": 1})
    assert stream_message == StreamMessage("s", 0, 1, 1, "k", NOW, None, {"n": 1})
    with pytest.raises(FrozenInstanceError):
        stream_message.id = 2  # type: ignore[misc]


@dataclass(slots=True)
class Unfrozen:
    a: int


@dataclass(frozen=True, slots=True)
class Checked:
    a: int

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError(self.a)


@dataclass(frozen=True)
class WithoutSlots:
    a: int


@pytest.mark.parametrize("cls", [Unfrozen, Checked, WithoutSlots])
def test_the_builder_refuses_what_it_cannot_build_as_the_constructor_would(cls: type) -> None:
    with pytest.raises(TypeError):
        builder(cls)
