"""The compile counter the "does not retrace" tests rely on: it sees retraces, so they can fail."""

from __future__ import annotations

import doctest

import jax
import jax.numpy as jnp
import pytest

from tests import compile_count
from tests.compile_count import count_compiles


def test_a_new_shape_is_counted_and_a_repeated_one_is_not() -> None:
    @jax.jit
    def scaled(x: jax.Array) -> jax.Array:
        return 3.0 * x

    scaled(jnp.ones(3))  # traced before the block: not counted
    with count_compiles() as compiled:
        scaled(jnp.ones(3))
    assert compiled.traces_of(scaled) == 0
    with count_compiles() as compiled:
        scaled(jnp.ones(4))
        scaled(jnp.ones(5))
        scaled(jnp.ones(5))
    # The assertion a "no retrace" test makes would fail here.
    assert compiled.traces_of(scaled) == 2
    assert compiled.backend_compiles["jit(scaled)"] == 2


def test_counts_a_static_argument_change_and_keeps_functions_apart() -> None:
    @jax.jit
    def other(x: jax.Array) -> jax.Array:
        return x - 1.0

    def power(x: jax.Array, n: int) -> jax.Array:
        return x**n

    powered = jax.jit(power, static_argnames="n")
    with count_compiles() as compiled:
        powered(jnp.ones(2), n=2)
        powered(jnp.ones(2), n=3)
        other(jnp.ones(2))
    assert (compiled.traces_of(powered), compiled.traces_of(other)) == (2, 1)


def test_only_the_block_is_counted() -> None:
    @jax.jit
    def late(x: jax.Array) -> jax.Array:
        return x * x

    with count_compiles() as compiled:
        pass
    late(jnp.ones(6))
    assert compiled.traces_of(late) == 0


def test_a_plain_function_is_refused() -> None:
    with count_compiles() as compiled, pytest.raises(TypeError, match=r"jax\.jit function"):
        compiled.traces_of(lambda x: x)


def test_the_module_example_runs() -> None:
    result = doctest.testmod(compile_count)
    assert result.attempted > 0 and result.failed == 0
