"""The built-in toy recipe, `rlpure train toy`: a scripted task that smoke-tests the whole loop.

Reward is the share of sampled tokens equal to a target token that depends on the batch and
problem index; the envs are `shell.fakes.ScriptedEnv`s, so it runs on any backend (`fake`,
`local`, `tinker`) in seconds.

Conventions:
- The recipe passes the options of its own that shape the run to `train(recipe_options=...)`,
  which records them and refuses a resume that changes one (exit code 2), as it does a changed
  `TrainConfig` field (see `shell.training`). The toy recipe records `--groups-per-batch` and
  `--group-size` (`toy_recipe_options`); `TOY_RESUME_MAY_CHANGE` may change.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from shell.clients import make_service_client
from shell.commands import TrainRecipe
from shell.config import TrainConfig
from shell.errors import ConfigError
from shell.fakes import ScriptedDataset, ScriptedEnv, ScriptedGroupBuilder
from shell.training import TrainResult, checked_last_checkpoint, recipe_options, train

__all__ = ["RECIPE", "TOY_RESUME_MAY_CHANGE", "check_toy_options", "toy_recipe_options"]


def _toy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("toy task")
    group.add_argument(
        "--num-batches", type=int, default=8, help="Number of training batches (default: 8)."
    )
    group.add_argument(
        "--groups-per-batch", type=int, default=4, help="Problems per batch (default: 4)."
    )
    group.add_argument(
        "--group-size", type=int, default=4, help="Rollouts per problem, G (default: 4)."
    )
    group.add_argument(
        "--env-latency",
        type=float,
        default=0.0,
        help="Simulated seconds per env step (default: 0).",
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


def check_toy_options(args: argparse.Namespace) -> None:
    """Refuses toy options that would train nothing or fail mid-run, before any client.

    Raises:
        ConfigError: `--num-batches`, `--groups-per-batch` or `--group-size` below 1, or
            `--env-latency` negative or not finite.
    """
    for name in ("num_batches", "groups_per_batch", "group_size"):
        value = getattr(args, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"toy --{name.replace('_', '-')}: must be an int >= 1, got {value!r}")
    latency = args.env_latency
    if (
        isinstance(latency, bool)
        or not isinstance(latency, (int, float))
        or not (math.isfinite(latency) and latency >= 0)
    ):
        raise ConfigError(f"toy --env-latency: must be a finite number >= 0, got {latency!r}")


async def _run_toy(config: TrainConfig, args: argparse.Namespace) -> TrainResult:
    check_toy_options(args)
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


RECIPE = TrainRecipe(
    "toy",
    help="Scripted toy task (reward = share of sampled tokens equal to a target token); a "
    "smoke test of the whole loop on any backend.",
    run=_run_toy,
    add_arguments=_toy_arguments,
    defaults={"max_tokens": 4, "eval_every": 4, "save_every": 4},
)
"""`rlpure train toy`."""
