"""An API key's queue and group patterns match names the way the database compares them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pgbroker._db.api_keys import ApiKey


def key(*patterns: str, groups: tuple[str, ...] = ("*",)) -> ApiKey:
    return ApiKey(1, "k", patterns, groups, frozenset({"read"}), None, datetime.now(UTC), None)


@pytest.mark.parametrize(
    ("pattern", "queue"),
    [
        ("EU-*", "eu-secret"),
        ("EU-*", "EU-secret"),
        ("eu-*", "Eu-Secret"),
        ("Orders", "oRDERS"),
        ("[A-C]x", "bx"),
    ],
)
def test_patterns_match_regardless_of_ascii_case(pattern: str, queue: str) -> None:
    assert key(pattern).sees(queue)
    assert key(pattern).allows("read", queue)


@pytest.mark.parametrize(
    ("pattern", "queue"),
    [
        ("EU-*", "us-secret"),
        ("eu-*", "US-EU-x"),
        # Beyond ASCII, how lower() folds depends on the database's collation: never fold more.
        ("é*", "Éclair"),
        ("straße", "STRASSE"),
        ("k", "\u212a"),  # KELVIN SIGN, which str.lower() turns into k
    ],
)
def test_patterns_never_fold_more_than_the_database(pattern: str, queue: str) -> None:
    assert not key(pattern).sees(queue)
    assert not key(pattern).allows("read", queue)


def test_a_letter_the_database_folds_otherwise_is_not_folded() -> None:
    # Under a Turkish collation lower('I') is a dotless i: the database takes INVOICES for another
    # queue than invoices, and so must the key.
    turkish = "abcdefgh\u0131jklmnopqrstuvwxyz"
    key = ApiKey(1, "k", ("invoices*",), ("*",), frozenset({"read"}), None, datetime.now(UTC), None, turkish)
    assert not key.sees("INVOICES")
    assert not key.sees("Invoices")
    assert key.sees("iNVOiCES")
    assert key.sees("invoices-eu")
    capitals = ApiKey(
        1, "k", ("INVOICES",), ("*",), frozenset({"read"}), None, datetime.now(UTC), None, turkish
    )
    assert capitals.sees("INVOICES")
    assert not capitals.sees("invoices")


@pytest.mark.parametrize(
    ("pattern", "group", "seen"),
    [
        ("billing", "billing", True),
        ("billing*", "billing.eu", True),
        ("b?lling", "billing", True),
        ("*", "Analytics", True),
        ("billing", "analytics", False),
        # The database holds group names apart by case: Billing is another group, perhaps another team's.
        ("billing", "Billing", False),
        ("billing", "BILLING", False),
        ("Billing*", "billing-x", False),
        ("BILLING", "BILLING", True),
    ],
)
def test_group_patterns_match_with_letter_case(pattern: str, group: str, seen: bool) -> None:
    assert key("*", groups=(pattern,)).sees_group(group) is seen


def test_a_key_sees_every_group_only_through_a_bare_star() -> None:
    assert key("*").sees_every_group
    assert key("*", groups=("billing", "**")).sees_every_group
    assert not key("*", groups=("billing", "b*")).sees_every_group
