"""The `rlpure` command line: `rlpure train RECIPE [options]` and the other commands.

Conventions:
- The commands (`rlpure demo`, ...) and training recipes (`rlpure train gsm8k`, ...) are the
  `Command` / `TrainRecipe` records `shell.jobs` lists by explicit import; `main` and
  `build_parser` take other tables (`commands=`, `recipes=`) for a program of your own.
- Every `TrainConfig` field is a `--flag` of `rlpure train` and of every recipe, documented
  from `shell.config.FIELD_HELP` with the defaults the recipe really uses. Precedence: defaults
  < recipe defaults < the recipe's defaults for the backend < `--config FILE` (TOML/JSON) < flags. The config is validated once, as a whole (`ConfigError` → exit code 2).
- Errors, decided per exception class (`_user_error`); each user error is ONE line on stderr
  (`rlpure: ...`), with its traceback only under `-v`:
  `ConfigError` (an option, `--config` file or log dir) → exit 2; any other `RlpureError`
  (data, checkpoints, rollouts, tokenizer) → exit 1; a `tinker.TinkerError` → exit 1 with what
  to check (`shell.clients.describe_tinker_error`); `PermissionError` and a full disk, quota or
  read-only file system → exit 1; Ctrl-C → 130. Anything else is a bug and keeps Python's
  traceback (exit 1). Recipe options given in `--config` sit between their defaults and flags.
- `--backend tinker` uses the real SDK, which reads `TINKER_API_KEY` from the environment; the
  key is never printed, logged or written to the log directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import inspect
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import msgspec

from shell.clients import describe_tinker_error, watch_tinker_retries
from shell.commands import Command, TrainRecipe
from shell.config import (
    FIELD_HELP,
    TrainConfig,
    build_config,
    check_log_dir,
    field_choices,
    load_config_file,
)
from shell.errors import ConfigError, RlpureError
from shell.jobs import COMMANDS, TRAIN_RECIPES
from shell.training import (
    METRICS_FILE,
    TrainResult,
    headline_eval_metrics,
    hold_log_dir,
    read_jsonl,
)

__all__ = ["build_parser", "main", "summary_line"]

logger = logging.getLogger(__name__)

# --- parser ------------------------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _optional_inner(annotation: Any) -> tuple[Any, bool]:
    args = get_args(annotation)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else annotation), True
    return annotation, False


def _is_struct(kind: Any) -> bool:
    """Whether a field's type is a nested record (e.g. `TerminationConfig`), given as JSON."""
    return isinstance(kind, type) and issubclass(kind, msgspec.Struct)


def _parse_value(kind: Any, nullable: bool, name: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if nullable and text.lower() in ("none", "null"):
            return None
        if get_origin(kind) is dict or kind is dict or _is_struct(kind):
            try:
                return json.loads(text)
            except json.JSONDecodeError as err:
                raise argparse.ArgumentTypeError(f"{_flag(name)}: expected JSON: {err}") from None
        if kind is int or kind is float:
            try:
                return kind(text)
            except ValueError:
                expected = "an integer" if kind is int else "a number"
                raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        return text

    return parse


def _default_text(
    name: str, base: Any, recipe: TrainRecipe | None, others: Sequence[TrainRecipe]
) -> str:
    """`(default: ...)` of a field: the recipe's, with its per-backend values; on the bare
    `rlpure train` parser the `TrainConfig` default and every recipe's own."""
    if recipe is not None:
        text = f"default: {recipe.defaults.get(name, base)!r}"
        per_backend = [
            f"{value!r} on --backend {backend}"
            for backend, layer in sorted(recipe.backend_defaults.items())
            if (value := layer.get(name, recipe.defaults.get(name, base)))
            != recipe.defaults.get(name, base)
        ]
        return f"({text}" + "".join(f"; {p}" for p in per_backend) + ")"
    overrides = []
    for other in others:
        layers = {
            "": other.defaults,
            **{f" --backend {b}": layer for b, layer in other.backend_defaults.items()},
        }
        for where, layer in layers.items():
            if name in layer and layer[name] != base:
                overrides.append(f"{other.name}{where}: {layer[name]!r}")
    return f"(default: {base!r}" + "".join(f"; {o}" for o in overrides) + ")"


def _add_config_options(
    parser: argparse.ArgumentParser,
    *,
    recipe: TrainRecipe | None = None,
    recipes: Sequence[TrainRecipe] = (),
) -> None:
    group = parser.add_argument_group(
        "training options (TrainConfig; override --config and recipe defaults)"
    )
    group.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="TOML or JSON file with TrainConfig fields and the recipe's own options, named "
        "as their flags with '_' for '-' (e.g. data_dir = \"data\"); flags override it.",
    )
    hints = get_type_hints(TrainConfig)  # without the `Annotated` constraints
    base = TrainConfig()
    for name in TrainConfig.__struct_fields__:
        kind, nullable = _optional_inner(hints[name])
        help_text = (
            f"{FIELD_HELP[name]} {_default_text(name, getattr(base, name), recipe, recipes)}"
        ).replace("%", "%%")  # argparse %-formats help; field docs may say `i % len(dataset)`
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
    recipe_defaults: bool = True,
) -> argparse.ArgumentParser:
    """The full `rlpure` parser: `train` with every recipe in `recipes`, and `commands`.

    With `recipe_defaults=False` a recipe's own options are absent from the namespace unless
    given (what `main` uses to put `--config` file values between defaults and flags).
    """
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
    ordered = sorted(recipes.values(), key=lambda r: r.name)
    _add_config_options(train_parser, recipes=ordered)
    recipe_parsers = train_parser.add_subparsers(dest="recipe", metavar="RECIPE", required=True)
    for recipe in ordered:
        recipe_parser = recipe_parsers.add_parser(
            recipe.name,
            help=recipe.help,
            description=recipe.description or recipe.help,
        )
        _add_config_options(recipe_parser, recipe=recipe)
        if recipe.add_arguments is not None:
            recipe.add_arguments(recipe_parser)
        if recipe.add_arguments is not None and not recipe_defaults:
            # Absent unless given, so a `--config` file's value can sit between the recipe's
            # default and the flag (`_apply_recipe_options`).
            # (`set_defaults` would put the SUPPRESS marker itself on the namespace; argparse
            # has no public way to reach an added action, hence `_actions`.)
            own = set(_recipe_defaults(recipe))
            for action in recipe_parser._actions:
                if action.dest in own:
                    action.default = argparse.SUPPRESS

    for cmd in sorted(commands.values(), key=lambda c: c.name):
        cmd_parser = subparsers.add_parser(
            cmd.name, help=cmd.help, description=cmd.description or cmd.help
        )
        if cmd.add_arguments is not None:
            cmd.add_arguments(cmd_parser)
    return parser


def _recipe_parser(recipe: TrainRecipe) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    if recipe.add_arguments is not None:
        recipe.add_arguments(parser)
    return parser


def _recipe_defaults(recipe: TrainRecipe) -> dict[str, Any]:
    """`{dest: default}` of the recipe's own options (`recipe.add_arguments`)."""
    return vars(_recipe_parser(recipe).parse_args([]))


def _file_recipe_options(
    recipe: TrainRecipe, values: Mapping[str, Any], path: str
) -> dict[str, Any]:
    """The recipe options of a `--config` file, parsed by the recipe's own flags (so a file
    value gets the flag's type and choices checks); a bool is `--x` / `--no-x`."""
    argv: list[str] = []
    for dest, value in values.items():
        flag = _flag(dest)
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is None:
            continue
        elif isinstance(value, (str, int, float)):
            argv.extend([flag, str(value)])
        else:
            raise ConfigError(
                f"config file {path}: {dest}: expected a string or number, got {value!r}"
            )
    try:
        parsed, extra = _recipe_parser(recipe).parse_known_args(argv)
    except argparse.ArgumentError as err:
        raise ConfigError(f"config file {path}: {err}") from None
    if extra:
        raise ConfigError(
            f"config file {path}: cannot read {' '.join(extra)!r} as {recipe.name} options"
        )
    return {dest: getattr(parsed, dest) for dest in values}


def _load_file(args: argparse.Namespace) -> dict[str, Any]:
    return load_config_file(args.config) if getattr(args, "config", None) else {}


def _config_from_args(recipe: TrainRecipe, args: argparse.Namespace) -> TrainConfig:
    """Defaults < recipe defaults < the recipe's defaults for the backend < file < flags."""
    fields = set(TrainConfig.__struct_fields__)
    file_layer = {k: v for k, v in _load_file(args).items() if k in fields}
    flags = {name: getattr(args, name) for name in fields if hasattr(args, name)}
    backend = flags.get("backend", file_layer.get("backend", recipe.defaults.get("backend")))
    backend = TrainConfig().backend if backend is None else str(backend)
    return build_config(recipe.defaults_for(backend), file_layer, flags)


def _apply_recipe_options(recipe: TrainRecipe, args: argparse.Namespace) -> None:
    """Fills `args` with the recipe's own options: default < `--config` file < flag.

    Raises:
        ConfigError: a file key that is neither a `TrainConfig` field nor a recipe option.
    """
    defaults = _recipe_defaults(recipe)
    file_values = _load_file(args)
    unknown = set(file_values) - set(TrainConfig.__struct_fields__) - set(defaults)
    if unknown:
        raise ConfigError(
            f"config file {args.config}: unknown field(s) {sorted(unknown)}: neither a "
            f"TrainConfig field nor a {recipe.name} option ({', '.join(sorted(defaults)) or 'none'})"
        )
    from_file = _file_recipe_options(
        recipe,
        {k: v for k, v in file_values.items() if k in defaults},
        str(getattr(args, "config", "")),
    )
    for dest, default in defaults.items():
        if not hasattr(args, dest):
            setattr(args, dest, from_file.get(dest, default))


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


def _final_eval(log_dir: str) -> str | None:
    """`name value` pairs of the final evaluation in `log_dir/metrics.jsonl`, or None."""
    try:
        records = read_jsonl(Path(log_dir) / METRICS_FILE)
    except (OSError, ValueError):
        return None
    finals = [r for r in records if r.get("final_eval")]
    if not finals:
        return None
    shown = [f"{key} {value:.3f}" for key, value in headline_eval_metrics(finals[-1]).items()]
    return ", ".join(shown) or None


def summary_line(result: TrainResult) -> str:
    """The last line `rlpure train` prints: what ran, the log dir, the final eval, the checkpoint.

    A rerun of a finished run trains nothing and says so; a run whose data ran out before its
    last step (async mode) counts the steps that ran, not the planned ones, and steps that
    trained on nothing are named.
    """
    start, end = result.start_step, result.end_step
    if end == start:
        head = f"Nothing to do: {result.log_dir} already trained {end} steps"
    elif result.ran_out_at is None:
        ran = end - start
        head = (
            f"Trained steps {start}..{end - 1} ({ran} step{'s' * (ran != 1)}, {end} in total) "
            f"in {result.log_dir}"
        )
    elif result.ran_out_at == start:
        head = (
            f"Trained no step in {result.log_dir}: the data ran out at step {start} of {end} "
            "(every group was filtered out or failed)"
        )
    else:
        ran = result.ran_out_at - start
        head = (
            f"Trained steps {start}..{result.ran_out_at - 1} ({ran} of the {end - start} "
            f"planned: the data ran out, groups were filtered out or failed) in {result.log_dir}"
        )
    parts = [head]
    if result.skipped_steps:
        n, shown = len(result.skipped_steps), ", ".join(map(str, result.skipped_steps[:10]))
        more = ", …" if n > 10 else ""
        parts.append(
            f"{n} step{'s' * (n != 1)} trained on nothing, every group failed: {shown}{more}"
        )
    final_eval = _final_eval(result.log_dir)
    if final_eval:
        parts.append(f"final eval: {final_eval}")
    if result.checkpoint is not None:
        parts.append(f"checkpoint: {result.checkpoint.state_path} (step {result.checkpoint.step})")
    if result.reward_curve:
        parts.append(f"reward curve: {result.reward_curve}")
    return "; ".join(parts)


_WORLD_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
"""`OSError`s that are the machine's state (disk full, quota, read-only file system), not a bug."""


def _user_error(err: BaseException) -> tuple[int, str] | None:
    """`(exit code, message)` for an exception that is the user's or the world's, else None.

    See the module docstring for the classes.
    """
    if isinstance(err, ConfigError):
        return 2, f"configuration error: {err}"
    if isinstance(err, RlpureError):
        return 1, f"{type(err).__name__}: {err}"
    tinker_error = describe_tinker_error(err)
    if tinker_error is not None:
        return 1, tinker_error
    if isinstance(err, PermissionError) or (
        isinstance(err, OSError) and err.errno in _WORLD_ERRNOS
    ):
        return 1, f"{type(err).__name__}: {err}"
    return None


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is: the run stops the way Ctrl-C stops it (what a
    `kill`, a job scheduler or a container stop sends), not with a bare exit."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While open, SIGTERM raises `Terminated` in the main thread (unless some other handler
    is installed: a server installs its own while it serves); the handler before is restored
    on exit."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
    ):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is _raise_terminated:  # not a stopping run's
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _exit_at_once(signum: int, frame: Any) -> None:
    print("rlpure: interrupted again; exiting now", file=sys.stderr, flush=True)
    os._exit(143 if signum == signal.SIGTERM else 130)


def _exit_on_a_second_signal() -> None:
    """Once a run is stopping: a second Ctrl-C (or SIGTERM) while it winds down (its clients
    closing, JAX's exit hooks) exits at once, in one line, instead of a traceback from
    whichever cleanup it lands in."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _exit_at_once)


def main(
    argv: Sequence[str] | None = None,
    *,
    commands: Mapping[str, Command] = COMMANDS,
    recipes: Mapping[str, TrainRecipe] = TRAIN_RECIPES,
) -> int:
    """Entry point of the `rlpure` console script; returns the exit code."""
    parser = build_parser(commands=commands, recipes=recipes, recipe_defaults=False)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("httpx", "jax", "absl"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    watch_tinker_retries()
    with terminate_as_interrupt():
        return _main(args, commands=commands, recipes=recipes)


def _main(
    args: argparse.Namespace,
    *,
    commands: Mapping[str, Command],
    recipes: Mapping[str, TrainRecipe],
) -> int:
    try:
        if args.command == "train":
            recipe = recipes[args.recipe]
            config = _config_from_args(recipe, args)
            _apply_recipe_options(recipe, args)
            check_log_dir(config.log_dir)
            # Held before the recipe loads data or compiles: a second run on this dir fails fast.
            with hold_log_dir(config.log_dir):
                result = _run(recipe.run, config, args)
            if isinstance(result, TrainResult):
                print(summary_line(result))
            return _exit_code(result)
        return _exit_code(_run(commands[args.command].run, args))
    except Terminated:
        _exit_on_a_second_signal()
        print("rlpure: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        _exit_on_a_second_signal()
        print("rlpure: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        handled = _user_error(err)
        if handled is None:
            raise  # a bug: Python prints the traceback (exit code 1)
        code, message = handled
        if args.verbose:
            traceback.print_exc(file=sys.stderr)
        print(f"rlpure: {' '.join(message.split())}", file=sys.stderr)
        return code


if __name__ == "__main__":
    raise SystemExit(main())
