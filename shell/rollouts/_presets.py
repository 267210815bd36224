"""Rollout configuration presets: `RolloutConfig`, `simple()`, `agentic()`, model defaults.

tinker-cookbook 0.6.1's `rl/rollout_presets.py`. `RolloutConfig` bundles the policy records
and the tool execution mode in one chz value, consumed by envs built with it, by
`run_rollout(policy, env, config=cfg)` and by `do_group_rollout(..., termination=...)`.
`model_defaults_to_agentic` also decides `_strategies.default_rollout_strategy_for_model`.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import chz

from shell.rollouts._policies import ParseErrorPolicy, RolloutLimits, TerminationRewardPolicy

__all__ = [
    "RolloutConfig",
    "ToolExecution",
    "agentic",
    "default_rollout_config_for_model",
    "model_defaults_to_agentic",
    "simple",
]

ToolExecution: TypeAlias = Literal["sequential", "parallel", "concurrent_safe"]
"""How an env runs one turn's tool calls: `"parallel"` (all at once, the default),
`"sequential"` (in the model's order; for tools sharing state) or `"concurrent_safe"`
(reserved; envs raise `NotImplementedError`)."""

_TOOL_EXECUTIONS = ("sequential", "parallel", "concurrent_safe")


def _tool_execution(obj: object, attr: str) -> None:
    value = getattr(obj, attr)
    if value not in _TOOL_EXECUTIONS:
        raise ValueError(
            f"{type(obj).__name__}.{attr.removeprefix('X_')}: expected one of "
            f"{', '.join(repr(v) for v in _TOOL_EXECUTIONS)}, got {value!r}"
        )


@chz.chz
class RolloutConfig:
    """All rollout policy knobs in one value; `RolloutConfig()` (== `simple()`) changes nothing.

    Attributes:
        limits: per-rollout budgets, enforced by `run_rollout` (default: all unlimited).
        parse_errors: parse-failure handling; None keeps the one-shot semantics.
        termination: stop-reason-keyed reward semantics; None leaves rewards untouched.
        tool_execution: how a turn's tool calls run.
    """

    limits: RolloutLimits = chz.field(
        default_factory=RolloutLimits,
        doc="Per-rollout budgets (turns, tokens, tool calls, wall clock), enforced by the "
        "rollout runner. Default: all unlimited.",
    )
    parse_errors: ParseErrorPolicy | None = chz.field(
        default=None,
        doc="Parse-failure handling (structural stop, content retries). Default None: "
        "one-shot parse-failure semantics.",
    )
    termination: TerminationRewardPolicy | None = chz.field(
        default=None,
        doc="Stop-reason-keyed reward semantics (grade-then-clamp for limit-stopped "
        "trajectories, grader timeout). Default None: rewards untouched.",
    )
    tool_execution: ToolExecution = chz.field(
        default="parallel",
        validator=_tool_execution,
        doc="How a turn's tool calls execute: 'parallel' (default), 'sequential' (in order) "
        "or 'concurrent_safe' (reserved; raises NotImplementedError).",
    )


def simple() -> RolloutConfig:
    """The minimal configuration: no budgets, one-shot parse failures, rewards untouched.

    Identical to passing no configuration at all.
    """
    return RolloutConfig()


def agentic() -> RolloutConfig:
    """An opinionated preset for multi-turn tool-use RL.

    - Budgets: 10 turns, 65536 trajectory tokens, 30 tool calls, so looping or rambling
      rollouts become recorded stop reasons instead of stragglers.
    - Parse errors: up to 2 consecutive content failures retried with a corrective message
      (structural failures still stop at once).
    - Rewards: grade, then clamp limit-stopped trajectories to `min(reward, 0.0)`; a group
      that all timed out skips grading; grading is bounded at 900 s.
    - Tools: sequential, in the model's call order.
    """
    return RolloutConfig(
        limits=RolloutLimits(max_turns=10, max_trajectory_tokens=65536, max_tool_calls=30),
        parse_errors=ParseErrorPolicy(max_consecutive=2),
        termination=TerminationRewardPolicy(
            zero_reward_on_limit=True,
            skip_grading_on_timeout=True,
            grader_timeout_seconds=900,
        ),
        tool_execution="sequential",
    )


def model_defaults_to_agentic(model_name: str) -> bool:
    """Whether `model_name` gets the agentic defaults: a `thinkingmachines/Inkling` model.

    The part before the first `:` is the base model, so the `:peft:` variants count too.

    Examples:
        >>> model_defaults_to_agentic("thinkingmachines/Inkling-1:peft:131072")
        True
        >>> model_defaults_to_agentic("Qwen/Qwen3-8B")
        False
    """
    return model_name.split(":", 1)[0].startswith("thinkingmachines/Inkling")


def default_rollout_config_for_model(model_name: str) -> RolloutConfig:
    """The rollout configuration a model gets when none is given.

    `agentic()` for `thinkingmachines/Inkling` models (tool-use models), `simple()` otherwise.
    """
    return agentic() if model_defaults_to_agentic(model_name) else simple()
