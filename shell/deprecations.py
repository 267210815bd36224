"""Deprecation warnings that turn into errors once their removal version is reached.

Conventions (tinker-cookbook 0.6.1's `utils/deprecation`):
- A warning reads `'<name>' is deprecated. It will be removed in version <v>. <message>` (the
  middle sentence only with a removal version), a `DeprecationWarning`. The decorated functions
  and classes and the module attributes attribute it to the code that used them (the cookbook
  attributes it to its own wrapper, so Python's default filters, which show a
  `DeprecationWarning` only when `__main__` triggers it, never show it).
- Once `current_version` (the version of the API the deprecated thing belongs to) is at or past
  the removal version, using it raises `RuntimeError` instead, so a stale path cannot live on.
  Versions compare as tuples of their leading integers (`"0.15.0.dev3+g1"` is `(0, 15, 0)`).
- `deprecated` marks a function (warns at each call) or a class (warns at each instantiation);
  `deprecated_module_getattr` makes a module `__getattr__` that serves renamed attributes
  from their new home, with a warning.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["deprecated", "deprecated_module_getattr", "version_tuple", "warn_deprecated"]

F = TypeVar("F", bound=Callable[..., Any])


def version_tuple(version: str) -> tuple[int, ...]:
    """The leading integers of a version's dotted parts (`(0,)` when there are none).

    Examples:
        >>> version_tuple("0.15.0.dev3+g1234"), version_tuple("1.2rc1.4"), version_tuple("x")
        ((0, 15, 0), (1, 2, 4), (0,))
    """
    parts: list[int] = []
    for segment in version.split("."):
        digits = ""
        for ch in segment:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) if parts else (0,)


def warn_deprecated(
    name: str,
    *,
    current_version: str,
    removal_version: str | None = None,
    message: str = "",
    stacklevel: int = 2,
) -> None:
    """Warns that `name` is deprecated, or raises once `current_version` reached
    `removal_version`.

    Args:
        name: what is deprecated (a function, parameter or attribute name).
        current_version: the version of the API `name` belongs to.
        removal_version: the version that removes it (None: no removal planned).
        message: what to use instead.
        stacklevel: `warnings.warn`'s: the frame the warning is attributed to (1: this
            function, 2: its caller, ...).

    Raises:
        RuntimeError: `current_version` is at or past `removal_version`.
    """
    parts = [f"'{name}' is deprecated."]
    if removal_version is not None:
        parts.append(f"It will be removed in version {removal_version}.")
    if message:
        parts.append(message)
    text = " ".join(parts)
    current = version_tuple(current_version)
    if removal_version is not None and current >= version_tuple(removal_version):
        raise RuntimeError(
            f"{text} (Current version is {'.'.join(map(str, current))}; this should have been "
            f"removed by {removal_version}.)"
        )
    warnings.warn(text, DeprecationWarning, stacklevel=stacklevel)


def deprecated(
    obj: F, *, current_version: str, message: str = "", removal_version: str | None = None
) -> F:
    """`obj` (a function or class), warning at each call or instantiation (see
    `warn_deprecated`); a class is changed in place (its `__init__`) and returned."""
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", str(obj)))
    options = {
        "current_version": current_version,
        "removal_version": removal_version,
        "message": message,
        "stacklevel": 3,  # the caller of the deprecated function or class
    }
    if isinstance(obj, type):
        original_init: Callable[..., None] = obj.__init__  # type: ignore[misc]

        @functools.wraps(original_init)
        def new_init(self: Any, *args: Any, **kwargs: Any) -> None:
            warn_deprecated(f"Class {name}", **options)  # type: ignore[arg-type]
            original_init(self, *args, **kwargs)

        obj.__init__ = new_init  # type: ignore[misc]
        return obj

    @functools.wraps(obj)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        warn_deprecated(f"Function {name}", **options)  # type: ignore[arg-type]
        return obj(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def deprecated_module_getattr(
    module_name: str,
    renamed: Mapping[str, tuple[str, str | None]],
    *,
    current_version: str,
) -> Callable[[str], Any]:
    """A module `__getattr__` serving `renamed[old] = ("package.module.New", removal_version)`
    from its new home, warning (or raising, see `warn_deprecated`) at each access.

    Raises (from the returned function):
        AttributeError: a name not in `renamed`.
        ValueError: a new path without a module part.
    """

    def __getattr__(name: str) -> Any:
        if name not in renamed:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        new_path, removal_version = renamed[name]
        module_path, _, attribute = new_path.rpartition(".")
        if not module_path:
            raise ValueError(
                f"make_deprecated_module_getattr: new path {new_path!r} must be a dotted path "
                "(e.g. 'package.module.Name')"
            )
        replacement = getattr(importlib.import_module(module_path), attribute)
        warn_deprecated(
            f"{module_name}.{name}",
            current_version=current_version,
            removal_version=removal_version,
            message=f"Use {new_path} instead.",
            stacklevel=3,  # the code that reads the attribute
        )
        return replacement

    return __getattr__
