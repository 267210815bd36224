"""Shape checks for the core's public array functions, after optax's `check_shapes_equal`.

Conventions:
- A check raises `ValueError` naming the calling function first, then the argument and both
  shapes: `"kl_sample_train_metrics: mask_D_T has shape (2, 4), expected (2, 3) (the shape of
  sampling_logprobs_D_T)"`. A mis-shaped mask is refused instead of being broadcast.
- Only shapes are read (`numpy.shape`), never values, so the checks also work on tracers: shapes
  are static under `jit`, and a check in a jitted function's body runs once per trace, before
  any broadcasting, at no run-time cost.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_rank", "check_shapes_equal"]


def check_shapes_equal(
    function: str, expected: tuple[str, Any], *given: tuple[str, Any]
) -> tuple[int, ...]:
    """Checks that every given array has the shape of the `expected` one.

    Args:
        function: the public function checking its arguments (heads the message).
        expected: `(name, array)` of the argument whose shape the others must have.
        *given: `(name, array)` pairs to compare; an array that is `None` (an optional
            argument left out) is skipped.

    Returns:
        The expected shape.

    Raises:
        ValueError: naming `function`, the first mismatched argument, `expected`'s name and
            both shapes.

    Examples:
        >>> check_shapes_equal("f", ("x_D_T", np.zeros((2, 3))), ("mask_D_T", np.ones((2, 3))))
        (2, 3)
        >>> check_shapes_equal("f", ("x_D_T", np.zeros((2, 3))), ("mask_D_T", np.ones((1, 3))))
        Traceback (most recent call last):
        ...
        ValueError: f: mask_D_T has shape (1, 3), expected (2, 3) (the shape of x_D_T)
    """
    expected_name, expected_value = expected
    shape = tuple(np.shape(expected_value))
    for name, value in given:
        if value is None:
            continue
        got = tuple(np.shape(value))
        if got != shape:
            raise ValueError(
                f"{function}: {name} has shape {got}, expected {shape} "
                f"(the shape of {expected_name})"
            )
    return shape


def check_rank(function: str, name: str, value: Any, axes: str) -> tuple[int, ...]:
    """Checks that `value` has one dimension per letter of `axes` (`"DT"`: `[D, T]`).

    Args:
        function: the public function checking its argument (heads the message).
        name: the argument's name.
        value: the array (or anything `numpy.shape` reads, a tracer included).
        axes: the expected axis letters; `""` means a scalar.

    Returns:
        The shape of `value`.

    Raises:
        ValueError: naming `function`, `name`, the expected axes and the shape.

    Examples:
        >>> check_rank("f", "rewards_P_G", np.zeros(3), "PG")
        Traceback (most recent call last):
        ...
        ValueError: f: rewards_P_G must be [P, G], got shape (3,)
    """
    shape = tuple(np.shape(value))
    if len(shape) != len(axes):
        want = f"[{', '.join(axes)}]" if axes else "a scalar"
        raise ValueError(f"{function}: {name} must be {want}, got shape {shape}")
    return shape
