"""What the `rlpure` CLI runs: `Command` (`rlpure NAME`) and `TrainRecipe` (`rlpure train NAME`).

Conventions:
- A recipe or command module builds one such record at import (`RECIPE = TrainRecipe(...)`,
  `COMMAND = Command(...)`); `shell.jobs` lists them by explicit import, so a renamed or
  broken recipe fails loudly instead of vanishing from `--help`.
- `by_name(items)` keys records by name and refuses duplicates; `rlpure train` is reserved.
- A recipe's `defaults` (and `backend_defaults[backend]`) are `TrainConfig` fields (checked at
  construction); precedence is `TrainConfig` defaults < recipe defaults < the recipe's defaults
  for the chosen backend < `--config FILE` < flags.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from shell.config import TrainConfig

__all__ = ["ArgumentsHook", "Command", "CommandRun", "RecipeRun", "TrainRecipe", "by_name"]

ArgumentsHook = Callable[[argparse.ArgumentParser], Any]
RecipeRun = Callable[[TrainConfig, argparse.Namespace], Awaitable[Any] | Any]
CommandRun = Callable[[argparse.Namespace], Awaitable[Any] | Any]


@dataclass(frozen=True)
class Command:
    """A top-level subcommand: `rlpure NAME ...`.

    Attributes:
        run: `(args) -> int | None`, sync or async; the exit code (None means 0).
        add_arguments: adds the command's flags to its parser.
    """

    name: str
    help: str
    run: CommandRun
    add_arguments: ArgumentsHook | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        if self.name == "train":
            raise ValueError("rlpure command name 'train' is reserved for training recipes")


@dataclass(frozen=True)
class TrainRecipe:
    """A training recipe: `rlpure train NAME [TrainConfig flags] [recipe flags]`.

    Attributes:
        run: `(config, args) -> TrainResult | int | None`, sync or async; builds the datasets
            and calls `shell.training.train` (`shell.clients.make_service_client(config)` gives
            the backend).
        add_arguments: adds recipe-specific flags to the recipe's parser.
        defaults: recipe defaults for `TrainConfig` fields (overridden by file and flags).
        backend_defaults: per backend (`"local"`, ...), `TrainConfig` defaults that replace
            `defaults` when that backend is chosen (still overridden by file and flags); the
            CLI applies them and `--help` shows them.

    Raises:
        ValueError: a default that is not a `TrainConfig` field.
    """

    name: str
    help: str
    run: RecipeRun
    add_arguments: ArgumentsHook | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str | None = None
    backend_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        fields = set(TrainConfig.__struct_fields__)
        unknown = set(self.defaults) - fields
        for backend, layer in self.backend_defaults.items():
            unknown |= {f"{backend}:{key}" for key in set(layer) - fields}
        if unknown:
            raise ValueError(f"train recipe {self.name!r}: unknown TrainConfig defaults {unknown}")
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))
        object.__setattr__(
            self,
            "backend_defaults",
            MappingProxyType(
                {
                    backend: MappingProxyType(dict(layer))
                    for backend, layer in self.backend_defaults.items()
                }
            ),
        )

    def defaults_for(self, backend: str) -> dict[str, Any]:
        """The recipe's `TrainConfig` defaults on `backend`: `defaults`, then its backend's."""
        return {**self.defaults, **self.backend_defaults.get(backend, {})}


_Named = TypeVar("_Named", Command, TrainRecipe)


def by_name(items: Iterable[_Named]) -> Mapping[str, _Named]:
    """`{item.name: item}`, read-only; a repeated name raises `ValueError`.

    Examples:
        >>> run = lambda args: 0
        >>> sorted(by_name([Command("a", "A", run), Command("b", "B", run)]))
        ['a', 'b']
    """
    table: dict[str, _Named] = {}
    for item in items:
        if item.name in table:
            raise ValueError(f"rlpure {type(item).__name__} {item.name!r} is already registered")
        table[item.name] = item
    return MappingProxyType(table)
