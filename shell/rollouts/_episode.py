"""The single-episode loop with limits and hooks: `run_rollout` (cookbook `rl/rollout_runner.py`).

Unconfigured, it is the plain loop (observation → `policy(ob, stop)` → `env.step(tokens,
extra=...)` → ... until `episode_done`). Configured, each turn checks, in order: the rollout
deadline and `max_turns`; `hooks.on_turn_begin` (injected messages count toward the trajectory
budget); the cumulative budgets (a remainder `<= 1` stops, the trajectory budget winning ties);
sampling with `max_tokens=min(max_turn_tokens, remainders)` under
`sampling_turn_timeout_seconds` (`SamplingTurnTimeoutError`); the env step, counting `"length"`
stops the env continued past (`TRUNCATION_METRIC_KEY` on the final transition).

Conventions:
- Actions reach `Env.step` as `list[int]` with `extra={"stop_reason": "stop" | "length"}`;
  `tinker.ModelInput` observations become `rlpure.records.ModelInput` before the policy sees them.
- Stop reasons are one-hot `stop/<reason>` metrics on the final transition (an env's own, or a
  runner stop on the last transition, an empty synthetic one when no turn completed); exactly
  one survives and `Trajectory.stop_reason` mirrors it.
- Records are immutable: where the cookbook edits the last transition in place, this loop
  replaces it with an edited copy.
- The rollout deadline is graceful (the partial trajectory is returned); a `TimeoutError` raised
  inside the loop by env or policy code propagates (the cookbook turns it into a
  `rollout_timeout` stop, hiding the env's failure; we do not reproduce that).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec
import numpy as np

from rlpure import limits as limits_lib
from rlpure.records import (
    STOP_METRIC_PREFIX,
    InitialObservationOverflow,
    ModelInput,
    StopCondition,
    StopReason,
    TokensWithLogprobs,
    Trajectory,
    Transition,
    as_model_input,
    as_stop_condition,
    as_tokens_with_logprobs,
)
from shell.completion import TokenCompleter
from shell.env import Env
from shell.errors import RlpureError
from shell.rollouts._policies import ParseErrorPolicy, RolloutLimits
from shell.rollouts._presets import RolloutConfig
from shell.timing import span

__all__ = [
    "TRUNCATION_METRIC_KEY",
    "RolloutHooks",
    "RolloutState",
    "SamplingTurnTimeoutError",
    "SupportsParseErrorPolicy",
    "SupportsToolCallLimit",
    "run_rollout",
    "stop_reason_from_metrics",
]

logger = logging.getLogger(__name__)

TRUNCATION_METRIC_KEY = "num_truncations_max_turn_tokens"
"""Final-transition metric: how many per-turn `"length"` stops the rollout continued past."""


class SamplingTurnTimeoutError(RlpureError, RuntimeError):
    """One sampling call exceeded `RolloutLimits.sampling_turn_timeout_seconds`.

    Raised, unlike the graceful whole-rollout deadline, because a timed-out sampling call leaves
    no turn to keep; tolerant rollout strategies retry the rollout. Deliberately not a
    `TimeoutError`, so it is never mistaken for the rollout deadline.
    """


class SupportsToolCallLimit(Protocol):
    """An env that enforces `RolloutLimits.max_tool_calls` itself (tool calls run inside it)."""

    def set_max_tool_calls(self, max_tool_calls: int) -> None: ...


class SupportsParseErrorPolicy(Protocol):
    """An env that applies a `ParseErrorPolicy` (parsing happens in its `step`)."""

    def set_parse_error_policy(self, policy: ParseErrorPolicy) -> None: ...


class RolloutState(msgspec.Struct, frozen=True, kw_only=True):
    """What the hooks see of a rollout in progress.

    Attributes:
        turn_index: policy calls completed so far (0 at the first `on_turn_begin`).
        observation_tokens: length of the current observation (the next sampling prompt).
        sampled_tokens: action tokens sampled so far.
        num_length_truncations: per-turn `"length"` stops the rollout continued past.
        elapsed_seconds: wall clock since the rollout started.
        transitions: the trajectory so far (a snapshot).
    """

    turn_index: int
    observation_tokens: int
    sampled_tokens: int
    num_length_truncations: int
    elapsed_seconds: float
    transitions: tuple[Transition, ...]


class RolloutHooks(Protocol):
    """Optional callbacks into the rollout loop; every method defaults to a no-op.

    Subclass it and override what you need (`class MyHooks(RolloutHooks): ...`), or pass any
    object with the same methods.
    """

    async def on_turn_begin(self, state: RolloutState) -> Sequence[Mapping[str, Any]] | None:
        """Messages to inject before this turn's sampling call, or None.

        Injection needs an env with `inject_messages` (else `TypeError`); the injected tokens
        count toward the trajectory budget.
        """
        return None

    async def on_stop_reason(self, reason: str, state: RolloutState) -> str | None:
        """Accept (return `reason`), override (another string) or clear (None) a stop.

        Called for env-reported and runner-imposed stops; not for the whole-rollout deadline
        firing during a turn (the loop is already cancelled then). Clearing a budget stop
        samples the next turn without the exhausted term; the check fires again next turn.
        """
        return reason

    async def on_grade(self, state: RolloutState) -> None:
        """Called once after the env ended the episode itself (after env-side grading)."""
        return None

    async def on_artifacts(self, state: RolloutState) -> None:
        """Called once right before the trajectory is returned, on every graceful path."""
        return None


def stop_reason_from_metrics(metrics: Mapping[str, float | int]) -> str | None:
    """The reason of the first one-hot `stop/<reason>` metric key, if there is one."""
    return limits_lib.stop_reason_from_metrics(metrics)


def _empty_transition(
    reward: float, metrics: Mapping[str, Any], logs: Mapping[str, Any]
) -> Transition:
    """A terminal transition with empty observation and action (it trains no tokens)."""
    return Transition(
        ob=ModelInput.empty(),
        ac=TokensWithLogprobs(tokens=np.zeros(0, np.int32), logprobs=np.zeros(0, np.float32)),
        reward=reward,
        episode_done=True,
        metrics=dict(metrics),
        logs=dict(logs),
    )


def _without_stop_metrics(metrics: Mapping[str, float | int]) -> dict[str, float | int]:
    return {k: v for k, v in metrics.items() if not k.startswith(STOP_METRIC_PREFIX)}


async def run_rollout(
    policy: TokenCompleter,
    env: Env,
    *,
    limits: RolloutLimits | None = None,
    hooks: RolloutHooks | None = None,
    parse_errors: ParseErrorPolicy | None = None,
    config: RolloutConfig | None = None,
) -> Trajectory:
    """Runs one episode of `env` with `policy` under optional limits and hooks.

    Args:
        policy: the token policy; called as `policy(ob, stop)`, or `policy(ob, stop,
            max_tokens=n)` when a per-turn token budget applies.
        env: a fresh, single-use env.
        limits: budgets of this rollout; None (default) is unlimited, or the env's own
            `rollout_limits` attribute when it has one.
        hooks: callbacks into the loop.
        parse_errors: pushed into the env at the start (`set_parse_error_policy`); None keeps
            the env's one-shot parse-failure semantics.
        config: a `RolloutConfig` whose `limits` / `parse_errors` are used where the explicit
            arguments were not given (its `termination` belongs to `do_group_rollout`).

    Returns:
        The trajectory (complete, or cut off gracefully by a limit), with `stop_reason` set
        when known; an env whose initial prompt overflows its budget
        (`InitialObservationOverflow`) gives one empty synthetic transition carrying its
        reward, metrics and logs.

    Raises:
        SamplingTurnTimeoutError: a sampling call exceeded `sampling_turn_timeout_seconds`.
    """
    if config is not None:
        limits = limits if limits is not None else config.limits
        parse_errors = parse_errors if parse_errors is not None else config.parse_errors
    if limits is None:
        # An env built with a RolloutConfig advertises its budgets, so a caller that passes
        # only the env (do_single_rollout in the training loop) still enforces them.
        limits = getattr(env, "rollout_limits", None)
    return await _RolloutRun(
        policy, env, limits=limits, hooks=hooks, parse_errors=parse_errors
    ).run()


class _RolloutRun:
    """The state and control flow of one rollout; single-use, like the env."""

    def __init__(
        self,
        policy: TokenCompleter,
        env: Env,
        *,
        limits: RolloutLimits | None,
        hooks: RolloutHooks | None,
        parse_errors: ParseErrorPolicy | None,
    ) -> None:
        self.policy = policy
        self.env = env
        self.limits = limits
        self.hooks = hooks
        self.parse_errors = parse_errors
        self.transitions: list[Transition] = []
        self.turn_index = 0
        self.sampled_tokens = 0
        self.num_truncations = 0
        self.ob = ModelInput.empty()
        self.stop_condition: StopCondition = ()
        self._start_time = time.monotonic()

    async def run(self) -> Trajectory:
        self._push_tool_call_limit()
        self._push_parse_error_policy()
        timeout = self.limits.rollout_timeout_seconds if self.limits is not None else None
        if timeout is None:
            return await self._run_loop()
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await self._run_loop()
        except TimeoutError:
            if not deadline.expired():  # raised by env or policy code, not our deadline
                raise
            # Graceful: keep the prefix collected so far. The loop was cancelled, so this stop
            # is not hook-clearable.
            return await self._finalize_runner_stop(StopReason.ROLLOUT_TIMEOUT)

    # --- the loop --------------------------------------------------------------------------

    async def _run_loop(self) -> Trajectory:
        env_name = type(self.env).__name__
        with span("env_initial_observation"):  # the cookbook's span names, here and below
            initial = await self.env.initial_observation()
        if isinstance(initial, InitialObservationOverflow):
            return await self._finalize_initial_overflow(initial)
        ob, stop = initial
        self.ob = as_model_input(ob, record=env_name, field="initial_observation")
        self.stop_condition = as_stop_condition(stop)

        while True:
            # 1. Between-turns deadline, then the runner's max_turns.
            reason = self._pre_turn_stop_reason()
            if reason is not None:
                resolved = await self._resolve_stop(reason)
                if resolved is not None:
                    return await self._finalize_runner_stop(resolved)

            # 2. Hook injection, before the budget arithmetic so injected tokens count.
            if self.hooks is not None:
                injected = await self.hooks.on_turn_begin(self._state())
                if injected:
                    await self._inject_messages(injected)

            # 3. Cumulative budgets (trajectory wins over sampled), then the per-call budget.
            reason = self._budget_stop_reason()
            if reason is not None:
                resolved = await self._resolve_stop(reason)
                if resolved is not None:
                    return await self._finalize_runner_stop(resolved)
                # Cleared: sample this turn without the exhausted term(s).
            budget = self._per_call_budget()

            # 4. Sample.
            ac = await self._sample(budget)

            # 5. Step the env and record the transition.
            with span("env_step"):
                step = await self.env.step(
                    ac.tokens.tolist(), extra={"stop_reason": ac.stop_reason}
                )
            transition = Transition(
                ob=self.ob,
                ac=ac,
                reward=step.reward,
                episode_done=step.episode_done,
                metrics=step.metrics,
                logs=step.logs,
            )
            self.transitions.append(transition)
            self.turn_index += 1
            self.sampled_tokens += len(ac.tokens)
            if ac.stop_reason == "length" and not step.episode_done:
                self.num_truncations += 1  # the env continued past a per-turn truncation
            self.ob = as_model_input(step.next_observation, record=env_name, field="step")
            self.stop_condition = tuple(step.next_stop_condition)

            if step.episode_done:
                env_reason = stop_reason_from_metrics(transition.metrics)
                if self.hooks is not None and env_reason is not None:
                    resolved = await self.hooks.on_stop_reason(env_reason, self._state())
                    if resolved is None:
                        # Cleared: un-terminate the transition and roll on from next_observation.
                        self.transitions[-1] = msgspec.structs.replace(
                            transition,
                            episode_done=False,
                            metrics=_without_stop_metrics(transition.metrics),
                        )
                        continue
                    if str(resolved) != env_reason:
                        metrics = _without_stop_metrics(transition.metrics)
                        metrics[f"{STOP_METRIC_PREFIX}{resolved}"] = 1.0
                        self.transitions[-1] = msgspec.structs.replace(transition, metrics=metrics)
                        env_reason = str(resolved)
                return await self._finalize_env_stop(env_reason)

    # --- limit checks ----------------------------------------------------------------------

    def _elapsed(self) -> float:
        return time.monotonic() - self._start_time

    def _pre_turn_stop_reason(self) -> str | None:
        lim = self.limits
        if lim is None:
            return None
        if (
            lim.rollout_timeout_seconds is not None
            and self._elapsed() >= lim.rollout_timeout_seconds
        ):
            return StopReason.ROLLOUT_TIMEOUT
        if lim.max_turns is not None and self.turn_index >= lim.max_turns:
            return StopReason.MAX_TURNS
        return None

    def _budget_stop_reason(self) -> str | None:
        lim = self.limits
        if lim is None:
            return None
        reason = limits_lib.budget_stop_reason(
            observation_tokens=self.ob.length,
            sampled_tokens=self.sampled_tokens,
            max_trajectory_tokens=lim.max_trajectory_tokens,
            max_sampled_tokens=lim.max_sampled_tokens,
        )
        return None if reason is None else StopReason(reason)

    def _per_call_budget(self) -> int | None:
        lim = self.limits
        if lim is None:
            return None
        return limits_lib.per_turn_token_budget(
            observation_tokens=self.ob.length,
            sampled_tokens=self.sampled_tokens,
            max_turn_tokens=lim.max_turn_tokens,
            max_trajectory_tokens=lim.max_trajectory_tokens,
            max_sampled_tokens=lim.max_sampled_tokens,
        )

    # --- sampling --------------------------------------------------------------------------

    async def _sample(self, budget: int | None) -> TokensWithLogprobs:
        turn_timeout = self.limits.sampling_turn_timeout_seconds if self.limits else None
        if turn_timeout is None:
            return await self._call_policy(budget)
        deadline = asyncio.timeout(turn_timeout)
        try:
            async with deadline:
                return await self._call_policy(budget)
        except TimeoutError as err:
            # The rollout deadline firing during sampling arrives here as a CancelledError
            # (this deadline did not expire), so it is not mistaken for a turn timeout.
            if not deadline.expired():
                raise
            raise SamplingTurnTimeoutError(
                f"Sampling call exceeded sampling_turn_timeout_seconds={turn_timeout}"
            ) from err

    async def _call_policy(self, budget: int | None) -> TokensWithLogprobs:
        # The override is passed only when a budget applies, so unconfigured rollouts work with
        # policies whose __call__ has no max_tokens keyword.
        with span("policy_sample"):
            if budget is None:
                ac = await self.policy(self.ob, self.stop_condition)
            else:
                ac = await self.policy(self.ob, self.stop_condition, max_tokens=budget)
        return as_tokens_with_logprobs(ac, record=type(self.policy).__name__, field="__call__")

    # --- hooks and env seams ---------------------------------------------------------------

    def _state(self) -> RolloutState:
        return RolloutState(
            turn_index=self.turn_index,
            observation_tokens=self.ob.length,
            sampled_tokens=self.sampled_tokens,
            num_length_truncations=self.num_truncations,
            elapsed_seconds=self._elapsed(),
            transitions=tuple(self.transitions),
        )

    async def _resolve_stop(self, reason: str) -> str | None:
        """A runner-imposed stop through `on_stop_reason`; None when a hook cleared it."""
        if self.hooks is None:
            return reason
        resolved = await self.hooks.on_stop_reason(str(reason), self._state())
        return None if resolved is None else str(resolved)

    async def _inject_messages(self, messages: Sequence[Mapping[str, Any]]) -> None:
        inject = getattr(self.env, "inject_messages", None)
        if inject is None:
            raise TypeError(
                "on_turn_begin returned messages to inject, but the environment "
                f"({type(self.env).__name__}) does not support message injection "
                "(no inject_messages method)"
            )
        ob, stop = await inject(list(messages))
        self.ob = as_model_input(ob, record=type(self.env).__name__, field="inject_messages")
        self.stop_condition = as_stop_condition(stop)

    def _push_tool_call_limit(self) -> None:
        if self.limits is None or self.limits.max_tool_calls is None:
            return
        setter = getattr(self.env, "set_max_tool_calls", None)
        if setter is None:
            logger.warning(
                "RolloutLimits.max_tool_calls=%d is configured, but the environment (%s) does "
                "not support a tool-call limit (no set_max_tool_calls method); the limit will "
                "not be enforced.",
                self.limits.max_tool_calls,
                type(self.env).__name__,
            )
            return
        setter(self.limits.max_tool_calls)

    def _push_parse_error_policy(self) -> None:
        if self.parse_errors is None:
            return
        setter = getattr(self.env, "set_parse_error_policy", None)
        if setter is None:
            logger.warning(
                "A ParseErrorPolicy is configured, but the environment (%s) does not support "
                "one (no set_parse_error_policy method); the default one-shot parse-failure "
                "semantics (failed_parse_reward / terminate_on_parse_error) will apply.",
                type(self.env).__name__,
            )
            return
        setter(self.parse_errors)

    # --- finishing -------------------------------------------------------------------------

    def _attach_truncation_metric(self) -> None:
        if self.num_truncations > 0 and self.transitions:
            last = self.transitions[-1]
            metrics = {**last.metrics, TRUNCATION_METRIC_KEY: float(self.num_truncations)}
            self.transitions[-1] = msgspec.structs.replace(last, metrics=metrics)

    async def _run_end_hooks(self, *, graded: bool) -> None:
        if self.hooks is None:
            return
        state = self._state()
        if graded:
            await self.hooks.on_grade(state)
        await self.hooks.on_artifacts(state)

    async def _finalize_initial_overflow(self, initial: InitialObservationOverflow) -> Trajectory:
        # The initial prompt already exceeds the env's budget: one synthetic transition carries
        # the overflow reward and stop metric. It trains no tokens, but its reward still counts
        # toward the group baseline, and the group survives.
        transition = _empty_transition(initial.reward, initial.metrics, initial.logs)
        self.transitions.append(transition)
        trajectory = Trajectory(
            transitions=tuple(self.transitions),
            final_ob=ModelInput.empty(),
            stop_reason=stop_reason_from_metrics(transition.metrics),
        )
        await self._run_end_hooks(graded=False)
        return trajectory

    async def _finalize_runner_stop(self, reason: str) -> Trajectory:
        """A runner-imposed stop: no env grading ran; the last transition becomes terminal."""
        stop_metric = {f"{STOP_METRIC_PREFIX}{reason}": 1.0}
        if self.transitions:
            last = self.transitions[-1]
            metrics = {**_without_stop_metrics(last.metrics), **stop_metric}
            self.transitions[-1] = msgspec.structs.replace(last, episode_done=True, metrics=metrics)
        else:
            self.transitions.append(_empty_transition(0.0, stop_metric, {}))
        self._attach_truncation_metric()
        trajectory = Trajectory(
            transitions=tuple(self.transitions), final_ob=self.ob, stop_reason=str(reason)
        )
        await self._run_end_hooks(graded=False)
        return trajectory

    async def _finalize_env_stop(self, reason: str | None) -> Trajectory:
        self._attach_truncation_metric()
        trajectory = Trajectory(
            transitions=tuple(self.transitions), final_ob=self.ob, stop_reason=reason
        )
        await self._run_end_hooks(graded=True)
        return trajectory
