"""The `rlpure` command line: `rlpure train RECIPE [options]` and pluggable commands.

Conventions:
- Commands (`rlpure demo`, ...) and training recipes (`rlpure train gsm8k`, ...) live in
  registries. A module adds one with a single decorated function::

      from shell.cli import command, train_recipe

      @train_recipe("gsm8k", help="GSM8K with GRPO", defaults={"max_tokens": 256})
      async def run_gsm8k(config: TrainConfig, args: argparse.Namespace) -> TrainResult: ...

      @command("demo", help="offline GRPO demo", add_arguments=lambda p: p.add_argument(...))
      def run_demo(args: argparse.Namespace) -> int: ...

  and is listed in `PLUGIN_MODULES`, which the CLI imports (if present) before parsing.
- Every `TrainConfig` field is a `--flag` of `rlpure train` and of every recipe, documented
  from `shell.config.FIELD_HELP`. Precedence: defaults < recipe defaults < `--config FILE`
  (TOML/JSON) < flags. The config is validated once, as a whole (`ConfigError` → exit code 2).
- A recipe passes the options of its own that shape the run to `train(recipe_options=...)`,
  which records them and refuses a resume that changes one (exit code 2), as it does a changed
  `TrainConfig` field (see `shell.resume`). The toy recipe records `--groups-per-batch` and
  `--group-size` (`toy_recipe_options`); `TOY_RESUME_MAY_CHANGE` may change.
- `--backend tinker` uses the real SDK, which reads `TINKER_API_KEY` from the environment; the
  key is never printed, logged or written to the log directory.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

import numpy as np

from shell.config import (
    FIELD_HELP,
    TrainConfig,
    build_config,
    field_choices,
    load_config_file,
)
from shell.errors import ConfigError, RlpureError
from shell.resume import checked_last_checkpoint, recipe_options
from shell.train import TrainResult, train

__all__ = [
    "COMMANDS",
    "PLUGIN_MODULES",
    "TOY_RESUME_MAY_CHANGE",
    "TRAIN_RECIPES",
    "Command",
    "TrainRecipe",
    "build_parser",
    "command",
    "main",
    "make_service_client",
    "toy_recipe_options",
    "train_recipe",
]

logger = logging.getLogger(__name__)

PLUGIN_MODULES: tuple[str, ...] = ("shell.gsm8k_recipe", "shell.demo")
"""Modules imported (when they exist) so their `@command` / `@train_recipe` functions register."""

ArgumentsHook = Callable[[argparse.ArgumentParser], Any]
RecipeRun = Callable[[TrainConfig, argparse.Namespace], Awaitable[Any] | Any]
CommandRun = Callable[[argparse.Namespace], Awaitable[Any] | Any]


@dataclass(frozen=True)
class Command:
    """A top-level subcommand: `rlpure NAME ...`."""

    name: str
    help: str
    run: CommandRun
    add_arguments: ArgumentsHook | None = None
    description: str | None = None


@dataclass(frozen=True)
class TrainRecipe:
    """A training recipe: `rlpure train NAME [TrainConfig flags] [recipe flags]`.

    Attributes:
        run: `(config, args) -> TrainResult | int | None`, sync or async; builds the datasets
            and calls `shell.train.train` (use `make_service_client(config)` for the backend).
        add_arguments: adds recipe-specific flags to the recipe's parser.
        defaults: recipe defaults for `TrainConfig` fields (overridden by file and flags).
    """

    name: str
    help: str
    run: RecipeRun
    add_arguments: ArgumentsHook | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str | None = None


COMMANDS: dict[str, Command] = {}
TRAIN_RECIPES: dict[str, TrainRecipe] = {}


def command(
    name: str,
    *,
    help: str,
    add_arguments: ArgumentsHook | None = None,
    description: str | None = None,
) -> Callable[[CommandRun], CommandRun]:
    """Registers the decorated function as `rlpure NAME` (returns it unchanged)."""

    def register(run: CommandRun) -> CommandRun:
        if name in COMMANDS or name == "train":
            raise ValueError(f"rlpure command {name!r} is already registered")
        COMMANDS[name] = Command(name, help, run, add_arguments, description)
        return run

    return register


def train_recipe(
    name: str,
    *,
    help: str,
    add_arguments: ArgumentsHook | None = None,
    defaults: Mapping[str, Any] | None = None,
    description: str | None = None,
) -> Callable[[RecipeRun], RecipeRun]:
    """Registers the decorated function as `rlpure train NAME` (returns it unchanged)."""

    def register(run: RecipeRun) -> RecipeRun:
        if name in TRAIN_RECIPES:
            raise ValueError(f"rlpure train recipe {name!r} is already registered")
        unknown = set(defaults or {}) - set(TrainConfig.__struct_fields__)
        if unknown:
            raise ValueError(f"train recipe {name!r}: unknown TrainConfig defaults {unknown}")
        TRAIN_RECIPES[name] = TrainRecipe(
            name, help, run, add_arguments, dict(defaults or {}), description
        )
        return run

    return register


def _load_plugins() -> None:
    for module in PLUGIN_MODULES:
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


# --- backends ----------------------------------------------------------------------------------


def make_service_client(config: TrainConfig) -> Any:
    """The service client of `config.backend` (duck-typed like `tinker.ServiceClient`).

    - `tinker`: `tinker.ServiceClient()`; the SDK reads `TINKER_API_KEY` from the environment.
    - `local`: `LocalServiceClient(seed=config.seed)` with states under `<log_dir>/local_states`
      (so a restarted run finds them).
    - `fake`: `FakeServiceClient` with states in `<log_dir>/fake_states.json`.

    Raises:
        ConfigError: `tinker` without `TINKER_API_KEY` in the environment.
    """
    log_dir = Path(config.log_dir)
    if config.backend == "tinker":
        if not os.environ.get("TINKER_API_KEY"):
            raise ConfigError(
                "backend 'tinker' needs the TINKER_API_KEY environment variable "
                "(export TINKER_API_KEY=...; it is never written to logs or configs)"
            )
        import tinker

        return tinker.ServiceClient()
    if config.backend == "local":
        from shell.local_backend import LocalServiceClient

        return LocalServiceClient(seed=config.seed, checkpoint_dir=log_dir / "local_states")
    from shell.fakes import FakeCheckpointStore, FakeServiceClient

    log_dir.mkdir(parents=True, exist_ok=True)
    return FakeServiceClient(
        store=FakeCheckpointStore(log_dir / "fake_states.json"), seed=config.seed
    )


# --- the built-in "toy" recipe -----------------------------------------------------------------


def _toy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("toy task")
    group.add_argument("--num-batches", type=int, default=8, help="Number of training batches.")
    group.add_argument("--groups-per-batch", type=int, default=4, help="Problems per batch.")
    group.add_argument("--group-size", type=int, default=4, help="Rollouts per problem (G).")
    group.add_argument(
        "--env-latency", type=float, default=0.0, help="Simulated seconds per env step."
    )


TOY_RESUME_MAY_CHANGE: frozenset[str] = frozenset({"num_batches", "env_latency"})
"""Toy options a resumed run may change: `--num-batches` only sets how long the run is (batch `i`
does not depend on it, like `--max-steps`), `--env-latency` only how long an env step waits."""

_TOY_OPTIONS = ("num_batches", "groups_per_batch", "group_size", "env_latency")
"""The `argparse` names of `_toy_arguments`' flags."""


def toy_recipe_options(args: argparse.Namespace) -> dict[str, Any]:
    """The toy options `train` records and checks on resume (`train(recipe_options=...)`).

    Every toy flag outside `TOY_RESUME_MAY_CHANGE`, plus `"recipe": "toy"` (so a log directory
    of another recipe is not resumed as a toy run).

    Examples:
        >>> args = argparse.Namespace(
        ...     num_batches=8, groups_per_batch=4, group_size=2, env_latency=0.0
        ... )
        >>> toy_recipe_options(args)
        {'recipe': 'toy', 'groups_per_batch': 4, 'group_size': 2}
    """
    fields = {name: getattr(args, name) for name in _TOY_OPTIONS}
    return recipe_options("toy", fields, may_change=TOY_RESUME_MAY_CHANGE)


def _toy_datasets(args: argparse.Namespace) -> tuple[Any, Any]:
    from shell.fakes import ScriptedDataset, ScriptedEnv, ScriptedGroupBuilder

    def make_builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        target = 3 + (batch * 7 + problem) % 8

        def reward(action: np.ndarray) -> float:
            return float(np.mean(action == target)) if len(action) else 0.0

        def make_env(_: int) -> ScriptedEnv:
            return ScriptedEnv(
                prompt=[1, 2, target], reward_fn=reward, latency=args.env_latency, stop=()
            )

        return ScriptedGroupBuilder(make_env, group_size=args.group_size, tags=("toy",))

    train_set = ScriptedDataset(
        make_builder, num_batches=args.num_batches, groups_per_batch=args.groups_per_batch
    )
    test_set = ScriptedDataset(make_builder, num_batches=1, groups_per_batch=2)
    return train_set, test_set


@train_recipe(
    "toy",
    help="Scripted toy task (reward = share of sampled tokens equal to a target token); a "
    "smoke test of the whole loop on any backend.",
    add_arguments=_toy_arguments,
    defaults={"max_tokens": 4, "eval_every": 4, "save_every": 4},
)
async def _run_toy(config: TrainConfig, args: argparse.Namespace) -> TrainResult:
    recipe_options = toy_recipe_options(args)
    # `train` checks again; checking here refuses a mixed run before a client is made.
    checked_last_checkpoint(config, recipe_options=recipe_options)
    dataset, test_dataset = _toy_datasets(args)
    return await train(
        config,
        dataset=dataset,
        test_dataset=test_dataset,
        service_client=make_service_client(config),
        recipe_options=recipe_options,
    )


# --- parser ------------------------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _optional_inner(annotation: Any) -> tuple[Any, bool]:
    args = get_args(annotation)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else annotation), True
    return annotation, False


def _parse_value(kind: Any, nullable: bool, name: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if nullable and text.lower() in ("none", "null"):
            return None
        if get_origin(kind) is dict or kind is dict:
            try:
                return json.loads(text)
            except json.JSONDecodeError as err:
                raise argparse.ArgumentTypeError(f"{_flag(name)}: expected JSON: {err}") from None
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        return text

    return parse


def _add_config_options(
    parser: argparse.ArgumentParser, *, defaults: Mapping[str, Any] | None = None
) -> None:
    group = parser.add_argument_group(
        "training options (TrainConfig; override --config and recipe defaults)"
    )
    group.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="TOML or JSON file with TrainConfig fields (flags override it).",
    )
    hints = inspect.get_annotations(TrainConfig, eval_str=True)
    base = TrainConfig()
    for name in TrainConfig.__struct_fields__:
        kind, nullable = _optional_inner(hints[name])
        default = (defaults or {}).get(name, getattr(base, name))
        help_text = f"{FIELD_HELP[name]} (default: {default!r})"
        if kind is bool:
            group.add_argument(
                _flag(name),
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        choices = field_choices(name)
        metavar = None if choices else name.upper()
        group.add_argument(
            _flag(name),
            type=_parse_value(kind, nullable, name),
            choices=choices,
            metavar=metavar,
            default=argparse.SUPPRESS,
            help=help_text,
        )


def build_parser() -> argparse.ArgumentParser:
    """The full `rlpure` parser (registered commands and recipes included)."""
    _load_plugins()
    parser = argparse.ArgumentParser(
        prog="rlpure",
        description="Reinforcement learning for language models on the Tinker API: a pure JAX "
        "core and a thin async shell. Run `rlpure COMMAND --help` for a command's options.",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="Log debug messages to stderr."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    train_parser = commands.add_parser(
        "train",
        help="Train with GRPO: rlpure train RECIPE [options].",
        description="Run (or resume) the GRPO training loop on a recipe's datasets. Re-running "
        "with the same --log-dir resumes from its last checkpoint. Every option below is also "
        "accepted after the recipe name; `rlpure train RECIPE --help` adds the recipe's own.",
    )
    _add_config_options(train_parser)
    recipes = train_parser.add_subparsers(dest="recipe", metavar="RECIPE", required=True)
    for recipe in sorted(TRAIN_RECIPES.values(), key=lambda r: r.name):
        recipe_parser = recipes.add_parser(
            recipe.name,
            help=recipe.help,
            description=recipe.description or recipe.help,
        )
        _add_config_options(recipe_parser, defaults=recipe.defaults)
        if recipe.add_arguments is not None:
            recipe.add_arguments(recipe_parser)

    for cmd in sorted(COMMANDS.values(), key=lambda c: c.name):
        cmd_parser = commands.add_parser(
            cmd.name, help=cmd.help, description=cmd.description or cmd.help
        )
        if cmd.add_arguments is not None:
            cmd.add_arguments(cmd_parser)
    return parser


def _config_from_args(recipe: TrainRecipe, args: argparse.Namespace) -> TrainConfig:
    file_layer: dict[str, Any] = {}
    if getattr(args, "config", None):
        file_layer = load_config_file(args.config)
    flags = {
        name: getattr(args, name) for name in TrainConfig.__struct_fields__ if hasattr(args, name)
    }
    return build_config(recipe.defaults, file_layer, flags)


def _exit_code(result: Any) -> int:
    if isinstance(result, int) and not isinstance(result, bool):
        return result
    return 0


def _run(fn: Callable[..., Any], *call_args: Any) -> Any:
    result = fn(*call_args)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rlpure` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("httpx", "jax", "absl"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.command == "train":
            recipe = TRAIN_RECIPES[args.recipe]
            config = _config_from_args(recipe, args)
            result = _run(recipe.run, config, args)
            if isinstance(result, TrainResult):
                print(
                    f"Trained steps {result.start_step}..{result.end_step} in {result.log_dir}"
                    + (f"; reward curve: {result.reward_curve}" if result.reward_curve else "")
                )
            return _exit_code(result)
        return _exit_code(_run(COMMANDS[args.command].run, args))
    except ConfigError as err:
        print(f"rlpure: configuration error: {err}", file=sys.stderr)
        return 2
    except RlpureError as err:
        print(f"rlpure: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rlpure: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
