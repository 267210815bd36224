"""tinker-cookbook 0.6.1's `utils.misc_utils`: small list, dict and path helpers, same semantics.

Conventions: nothing here mutates its inputs except `timed`, which writes one key into the
caller's metrics dict (the cookbook's contract, kept so ported code works unchanged).
"""

from __future__ import annotations

import importlib
import itertools
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np

__all__ = [
    "all_same",
    "concat_lists",
    "dict_mean",
    "iteration_dir",
    "lookup_func",
    "not_none",
    "safezip",
    "split_list",
    "timed",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@contextmanager
def timed(key: str, metrics: dict[str, Any]) -> Iterator[None]:
    """Measures the wall-clock time of the block into `metrics[f"time/{key}"]` (seconds).

    Logs the start and the duration at INFO. As in the cookbook, a block that raises records
    nothing.

    Args:
        key: the section's label; the metric is `time/{key}`.
        metrics: the dict that receives the elapsed seconds.
    """
    logger.info("Starting %s", key)
    started = time.perf_counter()
    yield
    elapsed = time.perf_counter() - started
    logger.info("%s took %.2f seconds", key, elapsed)
    metrics[f"time/{key}"] = elapsed


def _strict_zip(*iterables: Any) -> zip[Any]:
    return zip(*iterables, strict=True)


safezip = cast("type[zip[Any]]", _strict_zip)
"""`zip(..., strict=True)`: raises `ValueError` when the iterables' lengths differ."""


def dict_mean(list_of_dicts: Sequence[Mapping[str, float | int | None]]) -> dict[str, float]:
    """The per-key mean over `list_of_dicts`, each key over the dicts that have it.

    `None` values count as absent; a key whose values are all `None` is dropped.

    Examples:
        >>> dict_mean([{"a": 1, "b": None}, {"a": 2, "c": 4}])
        {'a': 1.5, 'c': 4.0}
    """
    values_by_key: dict[str, list[float | int]] = {}
    for entry in list_of_dicts:
        for key, value in entry.items():
            if value is not None:
                values_by_key.setdefault(key, []).append(value)
    return {key: float(np.mean(values)) for key, values in values_by_key.items()}


def all_same(xs: Sequence[Any]) -> bool:
    """True when every element equals the first (and for an empty sequence)."""
    return all(x == xs[0] for x in xs)


def lookup_func(path_to_func: str, default_module: str | None = None) -> Any:
    """The attribute named by `"package.module:name"`, or by a bare `name` in `default_module`.

    Raises:
        ValueError: `path_to_func` has more than one colon, or none and no `default_module`.
    """
    colons = path_to_func.count(":")
    if colons == 0 and default_module is not None:
        module_name, attribute = default_module, path_to_func
    elif colons == 1:
        module_name, attribute = path_to_func.split(":")
    else:
        raise ValueError(f"Invalid path: {path_to_func}")
    return getattr(importlib.import_module(module_name), attribute)


def split_list(lst: Sequence[T], num_splits: int) -> list[list[T]]:
    """`lst` cut into `num_splits` contiguous parts whose sizes differ by at most one.

    The cut points are `linspace(0, len(lst), num_splits + 1)` in float64, rounded down: the
    cookbook's points, which are not always `i * len // num_splits` (30 items into 22 parts
    differ), so the longer parts fall where the cookbook's do (5 into 2 gives sizes [2, 3]).

    Raises:
        ValueError: `num_splits` is not positive or exceeds `len(lst)`.

    Examples:
        >>> split_list([1, 2, 3, 4, 5], 2)
        [[1, 2], [3, 4, 5]]
    """
    if num_splits <= 0:
        raise ValueError(f"num_splits must be positive, got {num_splits}")
    if num_splits > len(lst):
        raise ValueError(f"Cannot split list of length {len(lst)} into {num_splits} parts")
    cuts = [int(c) for c in np.floor(np.linspace(0.0, float(len(lst)), num_splits + 1))]
    return [list(lst[start:stop]) for start, stop in itertools.pairwise(cuts)]


def concat_lists(list_of_lists: Sequence[Sequence[T]]) -> list[T]:
    """The sublists' elements, in order, in one list."""
    return [item for sublist in list_of_lists for item in sublist]


def not_none(x: T | None) -> T:
    """`x`, narrowed to non-`None`.

    Raises:
        AssertionError: `x` is `None` (the cookbook's error type).
    """
    if x is None:
        raise AssertionError(f"{x=} must not be None")
    return x


def iteration_dir(log_path: str | Path | None, step: int) -> Path | None:
    """`log_path/iteration_{step:06d}`, or `None` when `log_path` is `None` or empty."""
    if not log_path:
        return None
    return Path(log_path) / f"iteration_{step:06d}"
