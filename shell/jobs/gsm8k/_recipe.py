"""`rlpure train gsm8k`: Tinker tutorial 104 ("first RL") as a recipe, on Tinker or offline.

The recipe: GSM8K questions with the tutorial's `\\boxed{}` suffix and strawberry few-shot,
rendered `role_colon`; groups of `group_size` samples per question; reward
`0.1 * (format - 1) + correct` (`shell.jobs.gsm8k.Gsm8kEnv`); group-centred advantages; the
`importance_sampling` loss; Adam with lr 4e-5 and betas (0.9, 0.95); constant-reward groups
dropped (the tutorial skips them); greedy evaluation on the test split every `eval_every` steps
and at the end. Training runs in `shell.training.train` (metrics.jsonl, samples.jsonl, checkpoints,
reward_curve.png in `log_dir`; a re-run with the same `log_dir` resumes).

Defaults per backend (an option given on the command line or in `--config` always wins):

| option                 | `--backend tinker` (the tutorial) | `--backend local` (offline, CI-sized) |
|------------------------|-----------------------------------|---------------------------------------|
| `--base-model`         | `Qwen/Qwen3.5-9B-Base`            | `rlpure/tiny` (random init, bytes)    |
| `--max-tokens`         | 256                               | 16                                    |
| `--batch-size`         | 16 problems                       | 4 problems                            |
| `--group-size`         | 8 samples per problem             | 4 samples per problem                 |
| `--max-test-problems`  | all 1319                          | 4                                     |

Common to both: `--lora-rank 32`, `--learning-rate 4e-5`, `--adam-beta1 0.9`,
`--adam-beta2 0.95`, `--loss-fn importance_sampling`, `--remove-constant-reward-groups`,
`--eval-every 20`, `--save-every 20`, `--log-dir runs/gsm8k`, training problems shuffled by
`--seed`. The `fake` backend (scripted SDK doubles) takes the Tinker defaults.

The tokenizer and renderer come from the backend's training client (`get_tokenizer()`): the
recipe opens (or, when `log_dir` holds a checkpoint, restores) the training client itself with
`shell.training.open_training_client` and hands that same client to the loop, so a run opens
exactly one training session. The data is read and validated first, so a bad `--data-dir` fails
before any session is opened; the Tinker backend fails earlier still, before any data is read,
when `TINKER_API_KEY` is not set.

Resuming: the recipe options that shape training (`--data-dir`, `--batch-size`,
`--group-size`, `--fewshot`, `--format-coef`; see `gsm8k_recipe_options`) are recorded in
`log_dir/recipe_options.json`, and a re-run that changes any of them is refused with a
`ConfigError` naming it, before any client is opened, as a changed `TrainConfig` field is.
`--max-test-problems` and `--cache-dir` may change (`GSM8K_RESUME_MAY_CHANGE`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console

from rlpure.render import get_renderer
from shell.clients import ServiceClient, TrainingClient, make_service_client
from shell.commands import TrainRecipe
from shell.config import TrainConfig, build_config
from shell.errors import ConfigError, RlpureError
from shell.jobs.gsm8k._data import (
    Gsm8kDatasetBuilder,
    Gsm8kSplits,
    load_gsm8k_splits,
    without_stop_iteration,
)
from shell.training import (
    TrainResult,
    checked_last_checkpoint,
    open_training_client,
    recipe_options,
    train,
)

__all__ = [
    "GSM8K_CONFIG_DEFAULTS",
    "GSM8K_LOCAL_CONFIG_DEFAULTS",
    "GSM8K_RESUME_MAY_CHANGE",
    "GSM8K_TINKER_MODEL",
    "RECIPE",
    "Gsm8kOptions",
    "TokenizerUnavailableError",
    "add_gsm8k_arguments",
    "check_tinker_api_key",
    "default_gsm8k_options",
    "gsm8k_config",
    "gsm8k_recipe_options",
    "run_gsm8k",
    "run_gsm8k_recipe",
]

logger = logging.getLogger(__name__)


GSM8K_TINKER_MODEL = "Qwen/Qwen3.5-9B-Base"
"""The tutorial's base model (a pretrained, not instruction-tuned, Qwen)."""

GSM8K_CONFIG_DEFAULTS: Mapping[str, Any] = {
    "log_dir": "runs/gsm8k",
    "backend": "tinker",
    "base_model": GSM8K_TINKER_MODEL,
    "lora_rank": 32,
    "learning_rate": 4e-5,
    "adam_beta1": 0.9,
    "adam_beta2": 0.95,
    "loss_fn": "importance_sampling",
    "max_tokens": 256,
    "remove_constant_reward_groups": True,
    "eval_every": 20,
    "eval_temperature": 0.0,  # greedy test accuracy, as the recipe reports (cookbook default: 1.0)
    "save_every": 20,
}
"""The recipe's `TrainConfig` defaults (the tutorial's, for Tinker), `RECIPE.defaults`."""

GSM8K_LOCAL_CONFIG_DEFAULTS: Mapping[str, Any] = {
    "base_model": "rlpure/tiny",
    "max_tokens": 16,
}
"""`TrainConfig` defaults that replace `GSM8K_CONFIG_DEFAULTS` on the local backend (sized so
`--max-steps 2` runs in well under a minute of CPU on 2 cores), unless given explicitly."""


class TokenizerUnavailableError(RlpureError, OSError):
    """The training client's tokenizer cannot be loaded (Tinker: needs the Hugging Face hub)."""


class Gsm8kOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The recipe's own options (the data and the batch shape), beside `TrainConfig`.

    Attributes:
        data_dir: folder with `train.jsonl` / `test.jsonl`; None reads `openai/gsm8k` from the
            Hugging Face hub.
        batch_size: problems per training step (`--batch-size`).
        group_size: samples per problem (`--group-size`).
        max_test_problems: evaluate on the first N test problems (None: all 1319; 0: no
            evaluation).
        fewshot: prepend the tutorial's strawberry example to every question.
        format_coef: reward penalty of a malformed response.
        cache_dir: the `datasets` cache folder (None: its default).
    """

    data_dir: str | None = None
    batch_size: int = 16
    group_size: int = 8
    max_test_problems: int | None = None
    fewshot: bool = True
    format_coef: float = 0.1
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"gsm8k --batch-size: must be >= 1, got {self.batch_size}")
        if self.group_size < 1:
            raise ConfigError(f"gsm8k --group-size: must be >= 1, got {self.group_size}")
        if self.max_test_problems is not None and self.max_test_problems < 0:
            raise ConfigError(
                f"gsm8k --max-test-problems: must be >= 0, got {self.max_test_problems}"
            )
        if not (math.isfinite(self.format_coef) and self.format_coef >= 0):
            raise ConfigError(
                f"gsm8k --format-coef: must be a finite number >= 0, got {self.format_coef}"
            )


_TINKER_OPTIONS = Gsm8kOptions()
_LOCAL_OPTIONS = Gsm8kOptions(batch_size=4, group_size=4, max_test_problems=4)


def default_gsm8k_options(backend: str, **overrides: Any) -> Gsm8kOptions:
    """The recipe options for `backend` (see the module docstring), with `overrides` applied.

    Examples:
        >>> default_gsm8k_options("local").batch_size
        4
        >>> default_gsm8k_options("tinker", data_dir="data").group_size
        8
    """
    base = _LOCAL_OPTIONS if backend == "local" else _TINKER_OPTIONS
    return msgspec.structs.replace(base, **overrides)


def gsm8k_config(
    backend: str = "tinker", *, explicit: Mapping[str, Any] | None = None
) -> TrainConfig:
    """The recipe's `TrainConfig` for `backend`: recipe defaults, then `explicit` values.

    Args:
        backend: `"tinker"`, `"local"` or `"fake"`.
        explicit: `TrainConfig` fields that win over every default (e.g. `{"max_steps": 2}`).

    Raises:
        ConfigError: an unknown field or a value out of range.
    """
    explicit = dict(explicit or {})
    layers: list[Mapping[str, Any]] = [GSM8K_CONFIG_DEFAULTS, {"backend": backend}]
    if backend == "local":
        layers.append(GSM8K_LOCAL_CONFIG_DEFAULTS)
    return build_config(*layers, explicit)


GSM8K_RESUME_MAY_CHANGE: frozenset[str] = frozenset({"max_test_problems", "cache_dir"})
"""`Gsm8kOptions` fields a resumed run may change (evaluation size, cache location); the others
shape training and are checked on resume."""


def gsm8k_recipe_options(options: Gsm8kOptions) -> dict[str, Any]:
    """The options `train` records and checks on resume (`train(recipe_options=...)`).

    Every `Gsm8kOptions` field outside `GSM8K_RESUME_MAY_CHANGE`, plus `"recipe": "gsm8k"`;
    `data_dir` as an absolute path, so a relative path given from another directory compares
    equal.

    Examples:
        >>> gsm8k_recipe_options(Gsm8kOptions(batch_size=4))["batch_size"]
        4
        >>> sorted(gsm8k_recipe_options(Gsm8kOptions()))
        ['batch_size', 'data_dir', 'fewshot', 'format_coef', 'group_size', 'recipe']
    """
    fields = msgspec.structs.asdict(options)
    if fields["data_dir"] is not None:
        fields["data_dir"] = str(Path(fields["data_dir"]).resolve())
    return recipe_options("gsm8k", fields, may_change=GSM8K_RESUME_MAY_CHANGE)


def check_tinker_api_key(config: TrainConfig) -> None:
    """Fails early when the Tinker backend is chosen without `TINKER_API_KEY` set.

    The key's value is never read beyond "is it set", never logged nor stored.

    Raises:
        ConfigError: backend `tinker` and `TINKER_API_KEY` unset or empty.
    """
    if config.backend == "tinker" and not os.environ.get("TINKER_API_KEY"):
        raise ConfigError(
            "the GSM8K recipe on --backend tinker needs the TINKER_API_KEY environment variable "
            "(export TINKER_API_KEY=...). To run offline on the CPU instead, pass "
            "--backend local (e.g. rlpure train gsm8k --backend local --data-dir "
            "../shared/data/gsm8k)."
        )


# --- the recipe --------------------------------------------------------------------------------


# Any: a Hugging Face tokenizer on Tinker (see `shell.clients.TrainingClient.get_tokenizer`).
async def _tokenizer_of(training_client: TrainingClient, model: str) -> Any:
    try:
        # Tinker downloads the tokenizer from the Hugging Face hub: blocking IO, off the loop.
        return await asyncio.to_thread(training_client.get_tokenizer)
    except OSError as err:
        raise TokenizerUnavailableError(
            f"cannot load the tokenizer of {model!r} from its training client: {err}"
        ) from err


async def run_gsm8k(
    config: TrainConfig,
    *,
    options: Gsm8kOptions | None = None,
    service_client: ServiceClient | None = None,
    console: Console | None = None,
) -> TrainResult:
    """Runs (or resumes) the GSM8K recipe: data → training client → renderer → `train`.

    Args:
        config: the loop's options (`gsm8k_config(backend, explicit=...)` gives the recipe's).
        options: data and batch-shape options (default: `default_gsm8k_options(config.backend)`).
        service_client: the backend (default: the one of `config.backend`,
            `shell.clients.make_service_client`).
        console: where the progress lines go (default: stdout).

    Returns:
        The loop's `TrainResult`.

    Raises:
        ConfigError: backend `tinker` without `TINKER_API_KEY` (checked before anything else);
            resuming `log_dir` with a changed config field or recipe option (before any data
            is read).
        DatasetUnavailableError, Gsm8kDataError: the data cannot be read (before any client).
        TokenizerUnavailableError: the training client's tokenizer cannot be loaded.
    """
    if options is None:
        options = default_gsm8k_options(config.backend)
    if service_client is None:
        check_tinker_api_key(config)
    recipe_options = gsm8k_recipe_options(options)
    # `train` checks again; checking here refuses a mixed run before a session is opened.
    resume = checked_last_checkpoint(config, recipe_options=recipe_options)
    splits: Gsm8kSplits = await asyncio.to_thread(
        without_stop_iteration(load_gsm8k_splits),
        data_dir=options.data_dir,
        seed=config.seed,
        max_test_problems=options.max_test_problems,
        cache_dir=options.cache_dir,
    )
    logger.info(
        "GSM8K: %d training problems (shuffled, seed %d), %d test problems, from %s",
        len(splits.train),
        config.seed,
        len(splits.test),
        options.data_dir or "the Hugging Face hub",
    )
    if service_client is None:
        service_client = make_service_client(config)
    opened = await open_training_client(config, service_client, resume)
    tokenizer = await _tokenizer_of(opened.client, config.base_model)
    renderer = get_renderer("role_colon", tokenizer)
    dataset, test_dataset = await Gsm8kDatasetBuilder(
        batch_size=options.batch_size,
        group_size=options.group_size,
        renderer=renderer,
        fewshot=options.fewshot,
        format_coef=options.format_coef,
        preloaded=splits,
    )()
    return await train(
        config,
        dataset=dataset,
        test_dataset=test_dataset,
        service_client=service_client,
        tokenizer=tokenizer,
        training_client=opened,
        recipe_options=recipe_options,
        console=console,
    )


# --- command line ------------------------------------------------------------------------------


def add_gsm8k_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the recipe's own flags (data and batch shape) to `rlpure train gsm8k`."""
    group = parser.add_argument_group("GSM8K recipe (defaults: Tinker backend / local backend)")
    group.add_argument(
        "--data-dir",
        default=None,
        help="Folder with train.jsonl and test.jsonl (GSM8K schema: question, answer ending in "
        "'#### <number>'), e.g. ../shared/data/gsm8k. Default: openai/gsm8k (config main) from "
        "the Hugging Face hub.",
    )
    group.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"Problems per training step (default: {_TINKER_OPTIONS.batch_size} / "
        f"{_LOCAL_OPTIONS.batch_size}).",
    )
    group.add_argument(
        "--group-size",
        type=int,
        default=None,
        help=f"Samples per problem (default: {_TINKER_OPTIONS.group_size} / "
        f"{_LOCAL_OPTIONS.group_size}).",
    )
    group.add_argument(
        "--max-test-problems",
        type=int,
        default=None,
        help="Evaluate greedily on the first N test problems; 0 disables evaluation (default: "
        f"all 1319 / {_LOCAL_OPTIONS.max_test_problems}).",
    )
    group.add_argument(
        "--fewshot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Prepend the tutorial's strawberry few-shot example (default: on).",
    )
    group.add_argument(
        "--format-coef",
        type=float,
        default=0.1,
        help="Reward penalty of a response without a boxed answer (\\boxed{...} or \\boxed 7) or the stop sequence "
        "(default: 0.1).",
    )
    group.add_argument(
        "--cache-dir",
        default=None,
        help="The Hugging Face datasets cache folder (default: its own default).",
    )


def _options_from_args(backend: str, args: argparse.Namespace) -> Gsm8kOptions:
    given = {
        "data_dir": getattr(args, "data_dir", None),
        "batch_size": getattr(args, "batch_size", None),
        "group_size": getattr(args, "group_size", None),
        "max_test_problems": getattr(args, "max_test_problems", None),
        "fewshot": getattr(args, "fewshot", None),
        "format_coef": getattr(args, "format_coef", None),
        "cache_dir": getattr(args, "cache_dir", None),
    }
    base = msgspec.structs.asdict(default_gsm8k_options(backend))
    merged = {**base, **{k: v for k, v in given.items() if v is not None}}
    try:
        return msgspec.convert(merged, Gsm8kOptions)
    except msgspec.ValidationError as err:
        raise ConfigError(f"gsm8k options: {err}") from None


async def run_gsm8k_recipe(config: TrainConfig, args: argparse.Namespace) -> TrainResult:
    """The `rlpure train gsm8k` hook: the recipe options for the backend, then `run_gsm8k`.

    `config` arrives with the backend's defaults applied by the CLI (`RECIPE.backend_defaults`:
    `GSM8K_LOCAL_CONFIG_DEFAULTS` on the local backend) and the recipe options on `args`
    (flags over `--config` file values).
    """
    options = _options_from_args(config.backend, args)
    return await run_gsm8k(config, options=options)


_DESCRIPTION = (
    "Tinker tutorial 104 ('first RL'): GRPO on GSM8K with a \\boxed{} reward, the strawberry "
    "few-shot and the role_colon renderer; importance_sampling loss, lr 4e-5, betas (0.9, 0.95), "
    "LoRA rank 32; greedy test evaluation every --eval-every steps; metrics.jsonl and "
    "reward_curve.png in --log-dir. --backend tinker (default) trains Qwen/Qwen3.5-9B-Base "
    "(16 problems x 8 samples, 256 tokens; needs TINKER_API_KEY); --backend local trains "
    "rlpure/tiny on the CPU (4 x 4, 16 tokens, 4 test problems) unless given otherwise."
)


RECIPE = TrainRecipe(
    "gsm8k",
    help="GSM8K with GRPO (Tinker tutorial 104), on Tinker or offline.",
    run=run_gsm8k_recipe,
    add_arguments=add_gsm8k_arguments,
    defaults=GSM8K_CONFIG_DEFAULTS,
    backend_defaults={"local": GSM8K_LOCAL_CONFIG_DEFAULTS},
    description=_DESCRIPTION,
)
"""`rlpure train gsm8k`."""
