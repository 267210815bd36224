"""Scripted policies, envs and datasets that fail on cue (gathered by `shell.fakes`).

For tests and for users who want to exercise the rollouts and the loop without a model:
- `ScriptedPolicy` — a `TokenCompleter` returning scripted actions, failing at chosen calls.
- `ScriptedEnv` / `ScriptedGroupBuilder` / `ScriptedDataset` — envs with scripted rewards,
  latency and failures at chosen steps or creation indices, counting `make_envs` and `cleanup`.

Conventions: a scripted action is a sequence of token ids; the policy gives every action token
the same logprob (`logprob`, default -1). A `ScriptedEnv` episode is multi-turn with the prefix
property: each next observation is the previous one plus the action. Failures are scripted by
call index (policy), step index (env) or creation index (group builder), all 0-based.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlpure.records import Metrics, ModelInput, StepResult, StopCondition, TokensWithLogprobs
from shell.env import Action, ActionExtra, Env, EnvGroupBuilder, RLDataset
from shell.errors import EnvFailure

__all__ = [
    "ScriptedDataset",
    "ScriptedEnv",
    "ScriptedGroupBuilder",
    "ScriptedPolicy",
]


class ScriptedPolicy:
    """A `TokenCompleter` cycling through `actions`; call `n` raises `fail_at[n]` if present.

    Attributes:
        calls: `(observation tokens, stop condition)` of every call, in call order.
    """

    def __init__(
        self,
        *,
        actions: Sequence[Sequence[int]] = ((1, 2),),
        fail_at: Mapping[int, BaseException] | None = None,
        latency: float = 0.0,
        logprob: float = -1.0,
    ) -> None:
        # Records are immutable, so one `TokensWithLogprobs` per scripted action is shared.
        self.actions = [
            TokensWithLogprobs(
                tokens=np.asarray(a, np.int32),
                logprobs=np.full(len(a), logprob, np.float32),
                stop_reason="stop",
            )
            for a in actions
        ]
        self.fail_at = dict(fail_at or {})
        self.latency = latency
        self.calls: list[tuple[list[int], StopCondition]] = []

    async def __call__(
        self, model_input: ModelInput, stop: StopCondition, *, max_tokens: int | None = None
    ) -> TokensWithLogprobs:
        """The next scripted action, cut to `max_tokens` (the per-call budget) when given."""
        n = len(self.calls)
        self.calls.append((model_input.to_ints(), stop))
        if self.latency:
            await asyncio.sleep(self.latency)
        if n in self.fail_at:
            raise self.fail_at[n]
        action = self.actions[n % len(self.actions)]
        if max_tokens is not None and action.tokens.shape[0] > max_tokens:
            logprobs = None if action.logprobs is None else action.logprobs[:max_tokens]
            return TokensWithLogprobs(
                tokens=action.tokens[:max_tokens], logprobs=logprobs, stop_reason="length"
            )
        return action


class ScriptedEnv(Env):
    """An env with scripted per-step rewards, latency and an optional failure.

    The episode has `len(rewards)` steps; step `k` returns `rewards[k]` (or
    `reward_fn(action)` when given) and the next observation is the previous one plus the
    action (multi-turn with the prefix property). With `fail_at_step=k`, step `k` raises
    `error` (default `EnvFailure`); with `hang_at_step=k`, step `k` never returns. `latency`
    sleeps that many seconds in each step; `turns` yields that many event-loop turns instead
    (a latency that keeps the same order of events whatever the machine's load).

    Attributes:
        steps_taken: number of completed `step` calls.
        cancelled: whether a pending `step` was cancelled.
    """

    def __init__(
        self,
        *,
        prompt: Sequence[int] = (1, 2, 3),
        rewards: Sequence[float] = (1.0,),
        reward_fn: Callable[[np.ndarray], float] | None = None,
        latency: float = 0.0,
        turns: int = 0,
        fail_at_step: int | None = None,
        error: BaseException | None = None,
        hang_at_step: int | None = None,
        stop: StopCondition = (0,),
        metrics: Metrics | None = None,
    ) -> None:
        if not rewards:
            raise ValueError("ScriptedEnv.rewards: expected at least one step")
        self.prompt = list(prompt)
        self.rewards = list(rewards)
        self.reward_fn = reward_fn
        self.latency = latency
        self.turns = turns
        self.fail_at_step = fail_at_step
        self.error = error
        self.hang_at_step = hang_at_step
        self.stop = stop
        self.metrics = dict(metrics or {})
        self.steps_taken = 0
        self.cancelled = False
        self._ob = ModelInput.from_ints(self.prompt)

    async def initial_observation(self) -> tuple[ModelInput, StopCondition]:
        return self._ob, self.stop

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        k = self.steps_taken
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            for _ in range(self.turns):
                await asyncio.sleep(0)
            if k == self.hang_at_step:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if k == self.fail_at_step:
            raise self.error if self.error is not None else EnvFailure(f"scripted failure at {k}")
        action_arr = np.asarray(action, np.int32)
        reward = self.reward_fn(action_arr) if self.reward_fn else self.rewards[k]
        self.steps_taken = k + 1
        self._ob = self._ob.append(action_arr)
        return StepResult(
            reward=reward,
            episode_done=k + 1 == len(self.rewards),
            next_observation=self._ob,
            next_stop_condition=self.stop,
            metrics=self.metrics,
        )


class ScriptedGroupBuilder(EnvGroupBuilder):
    """Builds `group_size` envs per `make_envs` call with `env_factory(creation_index)`.

    `creation_index` counts envs across all `make_envs` calls of this builder (0, 1, ...), so a
    retry gets index `group_size`, `group_size + 1`, ...: script failures by index.

    Attributes:
        make_envs_calls, cleanup_calls: how often each was called.
        envs: every env created, by creation index.
    """

    def __init__(
        self,
        env_factory: Callable[[int], Env],
        *,
        group_size: int,
        group_rewards: Sequence[float] | None = None,
        rewards_error: BaseException | None = None,
        make_envs_error: BaseException | None = None,
        cleanup_error: BaseException | None = None,
        tags: Sequence[str] = ("scripted",),
    ) -> None:
        self.cleanup_error = cleanup_error
        self.env_factory = env_factory
        self.group_size = group_size
        self.group_rewards = None if group_rewards is None else list(group_rewards)
        self.rewards_error = rewards_error
        self.make_envs_error = make_envs_error
        self.tags = list(tags)
        self.make_envs_calls = 0
        self.cleanup_calls = 0
        self.envs: list[Env] = []
        self._counter = itertools.count()

    async def make_envs(self) -> Sequence[Env]:
        self.make_envs_calls += 1
        if self.make_envs_error is not None:
            raise self.make_envs_error
        envs = [self.env_factory(next(self._counter)) for _ in range(self.group_size)]
        self.envs.extend(envs)
        return envs

    async def compute_group_rewards(
        self, trajectory_group: Sequence[Any], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        if self.rewards_error is not None:
            raise self.rewards_error
        if self.group_rewards is None:
            return [(0.0, {}) for _ in trajectory_group]
        rewards = [
            self.group_rewards[i % len(self.group_rewards)] for i in range(len(trajectory_group))
        ]
        return [(r, {"group_reward": r}) for r in rewards]

    async def cleanup(self) -> None:
        self.cleanup_calls += 1
        if self.cleanup_error is not None:
            raise self.cleanup_error

    def logging_tags(self) -> list[str]:
        return list(self.tags)


class ScriptedDataset(RLDataset):
    """`num_batches` batches of `groups_per_batch` builders from `make_builder(batch, index)`."""

    def __init__(
        self,
        make_builder: Callable[[int, int], EnvGroupBuilder],
        *,
        num_batches: int,
        groups_per_batch: int,
    ) -> None:
        self.make_builder = make_builder
        self.num_batches = num_batches
        self.groups_per_batch = groups_per_batch

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"ScriptedDataset.get_batch: index {index} outside [0, {len(self)})")
        return [self.make_builder(index, p) for p in range(self.groups_per_batch)]

    def __len__(self) -> int:
        return self.num_batches
