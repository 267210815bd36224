"""`tinker_cookbook.utils.deprecation`: deprecation warnings, over `shell.deprecations`.

The version a removal is compared with is the cookbook API this facade mirrors
(`shell.cookbook.__version__`), as the cookbook compares with its own. Deliberate difference:
`deprecated` and `make_deprecated_module_getattr` attribute the warning to the code that used
the deprecated thing (the cookbook's point at its own wrapper).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

from shell.cookbook import __version__ as _API_VERSION
from shell.deprecations import deprecated as _deprecated
from shell.deprecations import deprecated_module_getattr
from shell.deprecations import warn_deprecated as _warn_deprecated

__all__ = ["deprecated", "make_deprecated_module_getattr", "warn_deprecated"]

F = TypeVar("F", bound=Callable[..., Any])


def warn_deprecated(
    name: str,
    *,
    removal_version: str | None = None,
    message: str = "",
    stacklevel: int = 2,
) -> None:
    """Warns that `name` is deprecated (attributed `stacklevel` frames up, 2: the caller of
    the function calling this), or raises `RuntimeError` once the API reached
    `removal_version`."""
    _warn_deprecated(
        name,
        current_version=_API_VERSION,
        removal_version=removal_version,
        message=message,
        stacklevel=stacklevel + 1,  # this adapter's frame
    )


@overload
def deprecated(__func: F) -> F: ...


@overload
def deprecated(*, message: str = ..., removal_version: str | None = ...) -> Callable[[F], F]: ...


def deprecated(
    _func: Callable[..., Any] | None = None,
    *,
    message: str = "",
    removal_version: str | None = None,
) -> Any:
    """Marks a function (warns at each call) or class (at each instantiation) deprecated; with
    or without arguments (`@deprecated`, `@deprecated(message=..., removal_version=...)`)."""

    def decorator(obj: F) -> F:
        return _deprecated(
            obj, current_version=_API_VERSION, message=message, removal_version=removal_version
        )

    return decorator(_func) if _func is not None else decorator


def make_deprecated_module_getattr(
    module_name: str, attrs: dict[str, tuple[str, str | None]]
) -> Callable[[str], Any]:
    """A module `__getattr__` serving `attrs[old] = ("package.module.New", removal_version)`
    from the new path, with a deprecation warning."""
    return deprecated_module_getattr(module_name, attrs, current_version=_API_VERSION)
