"""The `rlpure` command line: `rlpure train RECIPE [options]` and the other commands.

Conventions:
- The commands (`rlpure demo`, ...) and training recipes (`rlpure train gsm8k`, ...) are the
  `Command` / `TrainRecipe` records `shell.recipes` lists by explicit import; `main` and
  `build_parser` take other tables (`commands=`, `recipes=`) for a program of your own.
- Every `TrainConfig` field is a `--flag` of `rlpure train` and of every recipe, documented
  from `shell.config.FIELD_HELP`. Precedence: defaults < recipe defaults < `--config FILE`
  (TOML/JSON) < flags. The config is validated once, as a whole (`ConfigError` → exit code 2).
- `--backend tinker` uses the real SDK, which reads `TINKER_API_KEY` from the environment; the
  key is never printed, logged or written to the log directory.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, get_args, get_origin

from shell.commands import Command, TrainRecipe
from shell.config import (
    FIELD_HELP,
    TrainConfig,
    build_config,
    field_choices,
    load_config_file,
)
from shell.errors import ConfigError, RlpureError
from shell.recipes import COMMANDS, TRAIN_RECIPES
from shell.training import TrainResult

__all__ = ["build_parser", "main"]

logger = logging.getLogger(__name__)

PLUGIN_MODULES: tuple[str, ...] = ("shell.recipes.gsm8k", "shell.recipes.demo")
"""Modules imported (when they exist) so their `@command` / `@train_recipe` functions register."""

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


def build_parser(
    *,
    commands: Mapping[str, Command] = COMMANDS,
    recipes: Mapping[str, TrainRecipe] = TRAIN_RECIPES,
) -> argparse.ArgumentParser:
    """The full `rlpure` parser: `train` with every recipe in `recipes`, and `commands`."""
    parser = argparse.ArgumentParser(
        prog="rlpure",
        description="Reinforcement learning for language models on the Tinker API: a pure JAX "
        "core and a thin async shell. Run `rlpure COMMAND --help` for a command's options.",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="Log debug messages to stderr."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    train_parser = subparsers.add_parser(
        "train",
        help="Train with GRPO: rlpure train RECIPE [options].",
        description="Run (or resume) the GRPO training loop on a recipe's datasets. Re-running "
        "with the same --log-dir resumes from its last checkpoint. Every option below is also "
        "accepted after the recipe name; `rlpure train RECIPE --help` adds the recipe's own.",
    )
    _add_config_options(train_parser)
    recipe_parsers = train_parser.add_subparsers(dest="recipe", metavar="RECIPE", required=True)
    for recipe in sorted(recipes.values(), key=lambda r: r.name):
        recipe_parser = recipe_parsers.add_parser(
            recipe.name,
            help=recipe.help,
            description=recipe.description or recipe.help,
        )
        _add_config_options(recipe_parser, defaults=recipe.defaults)
        if recipe.add_arguments is not None:
            recipe.add_arguments(recipe_parser)

    for cmd in sorted(commands.values(), key=lambda c: c.name):
        cmd_parser = subparsers.add_parser(
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


def main(
    argv: Sequence[str] | None = None,
    *,
    commands: Mapping[str, Command] = COMMANDS,
    recipes: Mapping[str, TrainRecipe] = TRAIN_RECIPES,
) -> int:
    """Entry point of the `rlpure` console script; returns the exit code."""
    parser = build_parser(commands=commands, recipes=recipes)
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
            recipe = recipes[args.recipe]
            config = _config_from_args(recipe, args)
            result = _run(recipe.run, config, args)
            if isinstance(result, TrainResult):
                print(
                    f"Trained steps {result.start_step}..{result.end_step} in {result.log_dir}"
                    + (f"; reward curve: {result.reward_curve}" if result.reward_curve else "")
                )
            return _exit_code(result)
        return _exit_code(_run(commands[args.command].run, args))
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
