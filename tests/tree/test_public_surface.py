"""The declared public surface (docs/adr/0001-layout.md): ``pgbroker``'s ``__all__`` is the API, sync
and asyncio alike; a product package keeps its modules private (underscored) and exports what is
public from its ``__init__``, and the root re-exports all of it."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import pgbroker
from pgbroker import errors

PACKAGE = Path(pgbroker.__file__).parent
PRODUCTS = ("queues", "streams", "schedules", "runtime")


@pytest.mark.parametrize("product", PRODUCTS)
def test_the_modules_of_a_product_package_are_private(product: str) -> None:
    modules = sorted(p.name for p in (PACKAGE / product).glob("*.py") if p.name != "__init__.py")
    assert modules, f"pgbroker/{product}/ has no modules"
    assert [m for m in modules if not m.startswith("_")] == []


@pytest.mark.parametrize("product", PRODUCTS)
def test_the_root_exports_what_a_product_package_exports(product: str) -> None:
    package = importlib.import_module(f"pgbroker.{product}")
    assert sorted(set(package.__all__) - set(pgbroker.__all__)) == []


def test_every_public_name_resolves_and_async_ones_have_their_sync_twin() -> None:
    assert [name for name in pgbroker.__all__ if not hasattr(pgbroker, name)] == []
    async_names = [name for name in pgbroker.__all__ if name.startswith("Async")]
    assert {"AsyncBroker", "AsyncQueue", "AsyncStream", "AsyncTransaction"} <= set(async_names)
    assert [name for name in async_names if name.removeprefix("Async") not in pgbroker.__all__] == []


def test_every_error_is_exported() -> None:
    raised = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.PgbrokerError)
    }
    assert sorted(raised - set(pgbroker.__all__)) == []
