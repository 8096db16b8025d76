"""Receipt: the text form ``<msg_id>:<read_ct>:<lease>`` that pgbroker.receipt() makes in SQL."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgbroker import InvalidArgument, Receipt

BIGINT_MAX = 2**63 - 1
INT_MAX = 2**31 - 1
BIGINT_MIN = -(2**63)


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("1:1:1", Receipt(1, 1, 1)),
        ("42:3:1763686800123456", Receipt(42, 3, 1763686800123456)),
        ("0:0:-5", Receipt(0, 0, -5)),
        (f"{BIGINT_MAX}:{INT_MAX}:0", Receipt(BIGINT_MAX, INT_MAX, 0)),
    ],
)
def test_receipt_parses_its_three_numbers(token: str, expected: Receipt) -> None:
    assert Receipt.parse(token) == expected
    assert str(expected) == token


def test_receipt_text_form_is_canonical_after_surrounding_whitespace() -> None:
    assert str(Receipt.parse(" 7:2:99\n")) == "7:2:99"


@pytest.mark.parametrize(
    "token",
    [
        "",
        ":",
        "1:2",
        "1:2:3:4",
        "a:1:1",
        "1:-1:1",
        "-1:1:1",
        "1:1:1.0",
        "1::1",
        "1 :1:1",
        "1:1:+1",
        "0x1:1:1",
    ],
)
def test_malformed_receipt_text_is_an_invalid_argument_with_a_hint(token: str) -> None:
    with pytest.raises(InvalidArgument, match="malformed receipt") as info:
        Receipt.parse(token)
    assert info.value.hint


@pytest.mark.parametrize(
    "token",
    [
        f"{BIGINT_MAX + 1}:1:1",
        f"1:{INT_MAX + 1}:1",
        f"1:1:{BIGINT_MAX + 1}",
        f"1:1:{BIGINT_MIN - 1}",
    ],
)
def test_receipt_with_numbers_out_of_their_sql_range_is_an_invalid_argument(token: str) -> None:
    """msg_id is a bigint, read_ct an integer and the lease a bigint in SQL."""
    with pytest.raises(InvalidArgument):
        Receipt.parse(token)


@pytest.mark.parametrize("token", ["\u0661:1:1", "1:\u0967:1", "1:1:\uff11"])
def test_receipt_with_non_ascii_digits_is_an_invalid_argument(token: str) -> None:
    """SQL accepts [0-9] only; the client must not accept a receipt the server would refuse."""
    with pytest.raises(InvalidArgument):
        Receipt.parse(token)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, BIGINT_MAX),
    st.integers(0, INT_MAX),
    st.integers(BIGINT_MIN, BIGINT_MAX),
)
def test_receipt_text_round_trips(msg_id: int, read_ct: int, lease: int) -> None:
    receipt = Receipt(msg_id, read_ct, lease)
    assert Receipt.parse(str(receipt)) == receipt
