"""Every `Examples:` doctest in the pure core runs and gives what it shows."""

import doctest
import importlib
import pkgutil

import pytest

import rlpure

MODULES = sorted(m.name for m in pkgutil.walk_packages(rlpure.__path__, prefix="rlpure."))


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"


def test_the_main_functions_have_examples() -> None:
    attempted = {
        name: doctest.testmod(importlib.import_module(name), report=False).attempted
        for name in (
            "rlpure.advantages",
            "rlpure.packing._assembly",
            "rlpure.losses._registry",
            "rlpure.kl",
        )
    }
    assert all(attempted.values()), attempted
