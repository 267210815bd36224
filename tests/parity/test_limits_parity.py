"""`shell.rollouts.run_rollout` against tinker-cookbook 0.6.1's `rl.rollout_runner.run_rollout`.

The same scripted multi-turn env and scripted token policy run through both loops under
several `RolloutLimits`, `ParseErrorPolicy` and hook settings; the transitions (observation and
action tokens, logprobs, sampler stop reasons, rewards, episode flags, metrics, logs), the
final observation, the stop reason, the per-call `max_tokens` overrides and what the env was
given must agree. Each side gets the env built from its own records (the cookbook's dataclasses
and `tinker.ModelInput`, or ours). Skips without the cookbook (`make parity` installs it).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import tinker

from rlpure import records as ours_records
from shell import rollouts as ours
from tests.parity.porting import require_cookbook

BAD = 666
"""A sampled token the scripted env treats as a parse failure."""


def _cookbook() -> SimpleNamespace:
    require_cookbook()
    from tinker_cookbook import completers
    from tinker_cookbook.rl import rollout_limits, rollout_runner, types

    return SimpleNamespace(
        run_rollout=rollout_runner.run_rollout,
        SamplingTurnTimeoutError=rollout_runner.SamplingTurnTimeoutError,
        RolloutLimits=rollout_limits.RolloutLimits,
        ParseErrorPolicy=rollout_limits.ParseErrorPolicy,
        StepResult=types.StepResult,
        Env=types.Env,
        Overflow=types.InitialObservationOverflow,
        ob=tinker.ModelInput.from_ints,
        action=lambda tokens, logprobs, stop_reason: completers.TokensWithLogprobs(
            tokens=tokens, maybe_logprobs=logprobs, stop_reason=stop_reason
        ),
    )


OURS = SimpleNamespace(
    run_rollout=ours.run_rollout,
    SamplingTurnTimeoutError=ours.SamplingTurnTimeoutError,
    RolloutLimits=ours.RolloutLimits,
    ParseErrorPolicy=ours.ParseErrorPolicy,
    StepResult=ours_records.StepResult,
    Env=object,
    Overflow=ours_records.InitialObservationOverflow,
    ob=ours_records.ModelInput.from_ints,
    action=lambda tokens, logprobs, stop_reason: ours_records.TokensWithLogprobs(
        tokens=tokens, logprobs=logprobs, stop_reason=stop_reason
    ),
)


class ScriptedPolicy:
    """Call i samples `script[i]` (token ids), capped at the per-call `max_tokens` ("length")."""

    def __init__(self, kit: SimpleNamespace, script: Sequence[Sequence[int]], delays=()) -> None:
        self.kit = kit
        self.script = [list(s) for s in script]
        self.delays = list(delays)
        self.max_tokens_seen: list[Any] = []

    async def __call__(self, model_input, stop, **kwargs):
        i = len(self.max_tokens_seen)
        self.max_tokens_seen.append(kwargs.get("max_tokens", "absent"))
        if i < len(self.delays) and self.delays[i]:
            await asyncio.sleep(self.delays[i])
        tokens = self.script[i]
        cap = kwargs.get("max_tokens")
        stop_reason = "stop"
        if cap is not None and cap < len(tokens):
            tokens, stop_reason = tokens[:cap], "length"
        logprobs = [-0.25 * (k + 1) for k in range(len(tokens))]
        return self.kit.action(tokens, logprobs, stop_reason)


def scripted_env(
    kit: SimpleNamespace,
    *,
    prompt: int = 5,
    feedback: int = 3,
    turns: int = 4,
    terminate_on_length: bool = False,
    overflow: bool = False,
    with_seams: bool = False,
):
    """A multi-turn env over `kit`'s records.

    The observation grows by the action and `feedback` tokens each turn; step t rewards
    `0.5 * t`, logs `{"t": t}` and ends at `turns` with `stop/completed`. A `"length"` stop ends
    the episode with `stop/max_tokens` when `terminate_on_length`. An action containing `BAD`
    is a parse failure: with a pushed `ParseErrorPolicy` it is retried (reward
    `-penalty_per_error`, feedback grows the observation) up to `max_consecutive` in a row,
    then ends with `stop/parse_error` and `terminal_reward`; without a policy it ends at once
    with reward -1.
    """

    class Scripted(kit.Env):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.ob = list(range(1, prompt + 1))
            self.t = 0
            self.consecutive = 0
            self.received: list[Any] = []
            self.parse_policy: Any = None
            self.max_tool_calls: Any = None

        async def initial_observation(self):
            if overflow:
                return kit.Overflow(
                    reward=-0.75, metrics={"stop/max_tokens": 1.0, "len": 99.0}, logs={"o": "x"}
                )
            return kit.ob(self.ob), [0]

        async def step(self, action, *, extra=None):
            self.received.append((type(action).__name__, list(action), dict(extra or {})))
            self.t += 1
            self.ob = [*self.ob, *action, *([9] * feedback)]
            metrics: dict[str, float] = {"t2": 2.0 * self.t}
            reward, done = 0.5 * self.t, self.t >= turns
            if BAD in action:
                policy = self.parse_policy
                self.consecutive += 1
                if policy is not None and self.consecutive <= policy.max_consecutive:
                    reward, done = -policy.penalty_per_error, False
                    if policy.mask_error_turns:
                        metrics["parse_error_masked"] = 1.0
                else:
                    reward = policy.terminal_reward if policy is not None else -1.0
                    done = True
                    metrics["stop/parse_error"] = 1.0
            else:
                self.consecutive = 0
                if terminate_on_length and extra and extra.get("stop_reason") == "length":
                    done = True
                    metrics["stop/max_tokens"] = 1.0
                elif done:
                    metrics["stop/completed"] = 1.0
            return kit.StepResult(
                reward=reward,
                episode_done=done,
                next_observation=kit.ob(self.ob),
                next_stop_condition=[0],
                metrics=metrics,
                logs={"t": self.t},
            )

    if with_seams:

        class WithSeams(Scripted):
            def set_parse_error_policy(self, policy):
                self.parse_policy = policy

            def set_max_tool_calls(self, n):
                self.max_tool_calls = n

        return WithSeams()
    return Scripted()


def _plain(trajectory) -> dict[str, Any]:
    def ints(x):
        return [int(v) for v in x]

    return {
        "transitions": [
            {
                "ob": t.ob.to_ints(),
                "tokens": ints(t.ac.tokens),
                "logprobs": [float(v) for v in t.ac.maybe_logprobs],
                "sampler_stop": t.ac.stop_reason,
                "reward": float(t.reward),
                "episode_done": bool(t.episode_done),
                "metrics": {k: float(v) for k, v in t.metrics.items()},
                "logs": dict(t.logs),
            }
            for t in trajectory.transitions
        ],
        "final_ob": trajectory.final_ob.to_ints(),
        "stop_reason": None if trajectory.stop_reason is None else str(trajectory.stop_reason),
    }


def _run(kit: SimpleNamespace, case: dict[str, Any]) -> dict[str, Any]:
    env = scripted_env(kit, **case.get("env", {}))
    policy = ScriptedPolicy(kit, case["script"], case.get("delays", ()))
    kwargs: dict[str, Any] = {}
    if "limits" in case:
        kwargs["limits"] = kit.RolloutLimits(**case["limits"])
    if "parse_errors" in case:
        kwargs["parse_errors"] = kit.ParseErrorPolicy(**case["parse_errors"])
    if "hooks" in case:
        kwargs["hooks"] = case["hooks"]()
    try:
        traj = asyncio.run(kit.run_rollout(policy, env, **kwargs))
        outcome: dict[str, Any] = {"trajectory": _plain(traj)}
    except kit.SamplingTurnTimeoutError as err:
        outcome = {"raised": "SamplingTurnTimeoutError", "message": str(err)}
    outcome["max_tokens_seen"] = policy.max_tokens_seen
    outcome["env_received"] = env.received
    outcome["pushed"] = (_pushed_policy(env.parse_policy), env.max_tool_calls)
    return outcome


_PARSE_FIELDS = (
    "max_consecutive",
    "retry_message_template",
    "penalty_per_error",
    "terminal_reward",
    "mask_error_turns",
)


def _pushed_policy(policy: Any) -> dict[str, Any] | None:
    return None if policy is None else {f: getattr(policy, f) for f in _PARSE_FIELDS}


class ClearFirstThenOverride:
    """Clears the first stop it is offered, renames the second to `custom`, accepts the rest."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def on_turn_begin(self, state):
        return None

    async def on_stop_reason(self, reason, state):
        self.seen.append(str(reason))
        if len(self.seen) == 1:
            return None
        if len(self.seen) == 2:
            return "custom"
        return reason

    async def on_grade(self, state):
        return None

    async def on_artifacts(self, state):
        return None


FIVE = [[10, 11, 12, 13, 14]] * 8
CASES: dict[str, dict[str, Any]] = {
    "unconfigured": {"script": FIVE},
    "max_turns": {"script": FIVE, "limits": {"max_turns": 2}},
    "max_turns_equal_to_env_turns": {"script": FIVE, "limits": {"max_turns": 4}},
    "trajectory_budget": {"script": FIVE, "limits": {"max_trajectory_tokens": 20}},
    "trajectory_budget_truncates": {"script": FIVE, "limits": {"max_trajectory_tokens": 17}},
    "prompt_over_budget": {"script": FIVE, "limits": {"max_trajectory_tokens": 6}},
    "sampled_budget": {"script": FIVE, "limits": {"max_sampled_tokens": 12}},
    "turn_cap_continues": {"script": FIVE, "limits": {"max_turn_tokens": 3}},
    "turn_cap_then_sampled": {"script": FIVE, "limits": {"max_turn_tokens": 4, "max_sampled_tokens": 9}},
    "turn_cap_one": {"script": FIVE, "limits": {"max_turn_tokens": 1}},
    "all_token_limits": {"script": FIVE, "limits": {"max_turn_tokens": 4, "max_trajectory_tokens": 30, "max_sampled_tokens": 11}},
    "both_budgets_exhausted": {"script": FIVE, "limits": {"max_trajectory_tokens": 14, "max_sampled_tokens": 6}},
    "max_turns_before_budget": {"script": FIVE, "limits": {"max_turns": 1, "max_trajectory_tokens": 14}},
    "terminate_on_length": {"script": FIVE, "env": {"terminate_on_length": True}, "limits": {"max_turn_tokens": 3}},
    "overflow_sentinel": {"script": FIVE, "env": {"overflow": True}},
    "overflow_with_limits": {"script": FIVE, "env": {"overflow": True}, "limits": {"max_turns": 1}},
    "rollout_timeout_mid_sample": {"script": FIVE, "delays": [0, 0, 1.0], "limits": {"rollout_timeout_seconds": 0.15}},
    "rollout_timeout_first_sample": {"script": FIVE, "delays": [1.0], "limits": {"rollout_timeout_seconds": 0.05}},
    "sampling_turn_timeout": {"script": FIVE, "delays": [0, 1.0], "limits": {"sampling_turn_timeout_seconds": 0.05}},
    "slow_but_within_turn_timeout": {"script": FIVE, "delays": [0.01], "limits": {"sampling_turn_timeout_seconds": 1.0}},
    "tool_calls_pushed": {"script": FIVE, "env": {"with_seams": True}, "limits": {"max_tool_calls": 7}},
    "parse_error_one_shot": {"script": [[10, BAD], *FIVE], "env": {"with_seams": True}},
    "parse_error_retried": {
        "script": [[10, BAD], [BAD], [11, 12], *FIVE],
        "env": {"with_seams": True},
        "parse_errors": {"max_consecutive": 2, "penalty_per_error": 0.125, "mask_error_turns": True},
    },
    "parse_error_exceeds": {
        "script": [[BAD], [BAD], *FIVE],
        "env": {"with_seams": True},
        "parse_errors": {"max_consecutive": 1, "terminal_reward": -2.0},
    },
    "parse_policy_without_seam": {"script": [[BAD], *FIVE], "parse_errors": {"max_consecutive": 3}},
    "parse_errors_under_budget": {
        "script": [[BAD, 1, 2], [BAD], [5], *FIVE],
        "env": {"with_seams": True},
        "parse_errors": {"max_consecutive": 5},
        "limits": {"max_trajectory_tokens": 22},
    },
    "hook_clears_then_overrides_env_stop": {"script": FIVE, "env": {"turns": 2}, "hooks": ClearFirstThenOverride},
    "hook_clears_budget_stop": {
        "script": FIVE,
        "limits": {"max_trajectory_tokens": 16, "max_turn_tokens": 4},
        "hooks": ClearFirstThenOverride,
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_rollout_agrees_with_the_cookbook(name: str) -> None:
    cookbook = _cookbook()
    case = CASES[name]
    theirs = _run(cookbook, case)
    mine = _run(OURS, case)
    assert mine == theirs
    # the scenario really exercised something: a trajectory or the raising timeout
    assert "trajectory" in mine or mine["raised"] == "SamplingTurnTimeoutError"


def test_the_cases_cover_every_stop_reason_the_runner_imposes() -> None:
    cookbook = _cookbook()
    reasons = {
        _run(cookbook, case).get("trajectory", {}).get("stop_reason") for case in CASES.values()
    }
    assert {
        "completed",
        "max_turns",
        "max_tokens",
        "max_sampled_tokens",
        "rollout_timeout",
        "parse_error",
        "custom",
    } <= reasons


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_turns": 0},
        {"max_turn_tokens": -1},
        {"rollout_timeout_seconds": 0},
        {"sampling_turn_timeout_seconds": -0.5},
    ],
)
def test_invalid_limits_are_refused_by_both(kwargs: dict[str, Any]) -> None:
    cookbook = _cookbook()
    ((field, value),) = kwargs.items()
    with pytest.raises(
        ValueError, match=f"must be a positive value or None \\(unlimited\\), got {value!r}"
    ):
        cookbook.RolloutLimits(**kwargs)
    with pytest.raises(ValueError, match=f"RolloutLimits.{field} must be a positive value or None"):
        ours.RolloutLimits(**kwargs)


def test_records_and_presets_have_the_cookbook_fields_and_defaults() -> None:
    require_cookbook()
    import chz
    from tinker_cookbook.rl import rollout_limits, rollout_presets

    pairs: list[tuple[Callable[[], Any], Callable[[], Any]]] = [
        (rollout_limits.RolloutLimits, ours.RolloutLimits),
        (rollout_limits.ParseErrorPolicy, ours.ParseErrorPolicy),
        (rollout_limits.TerminationRewardPolicy, ours.TerminationRewardPolicy),
        (rollout_presets.simple, ours.simple),
        (rollout_presets.agentic, ours.agentic),
    ]
    for theirs_factory, mine_factory in pairs:
        assert chz.asdict(mine_factory()) == chz.asdict(theirs_factory())
    assert ours.DEFAULT_RETRY_MESSAGE_TEMPLATE == rollout_limits.DEFAULT_RETRY_MESSAGE_TEMPLATE
    assert ours.DEFAULT_LIMIT_STOP_REASONS == rollout_limits.DEFAULT_LIMIT_STOP_REASONS
    for model in (
        "thinkingmachines/Inkling-1",
        "thinkingmachines/Inkling-x:peft:1",
        "Qwen/Qwen3-8B",
    ):
        assert chz.asdict(ours.default_rollout_config_for_model(model)) == chz.asdict(
            rollout_presets.default_rollout_config_for_model(model)
        )
        cookbook_strategy = rollout_presets.default_rollout_strategy_for_model(model)
        assert ours.model_defaults_to_agentic(model) == (
            type(cookbook_strategy).__name__ == "MinViableGroup"
        )


def test_deliberate_difference_an_env_timeout_error_is_not_the_rollout_deadline() -> None:
    """The cookbook turns *any* `TimeoutError` raised inside the loop into a graceful
    `rollout_timeout` stop when a rollout deadline is configured, so an env's own failure (a
    grader or sandbox timing out) becomes a budget stop and is trained on; ours lets it
    propagate, so rollout strategies see the failure (documented in `shell.rollouts._episode`)."""
    cookbook = _cookbook()

    def failing(kit):
        env = scripted_env(kit)

        async def step(action, *, extra=None):
            raise TimeoutError("grader timed out")

        env.step = step
        return env

    limits: dict[str, Any] = {"rollout_timeout_seconds": 5.0}
    theirs = asyncio.run(
        cookbook.run_rollout(
            ScriptedPolicy(cookbook, FIVE),
            failing(cookbook),
            limits=cookbook.RolloutLimits(**limits),
        )
    )
    assert theirs.stop_reason == "rollout_timeout"
    with pytest.raises(TimeoutError, match="grader timed out"):
        asyncio.run(
            ours.run_rollout(
                ScriptedPolicy(OURS, FIVE), failing(OURS), limits=ours.RolloutLimits(**limits)
            )
        )


def _group(kit: SimpleNamespace, records: Any, step_rewards_G, stop_reasons_G):
    """Trajectories with the given per-step rewards and stop reasons, in `records`' types."""
    trajectories = []
    for steps, reason in zip(step_rewards_G, stop_reasons_G, strict=True):
        transitions = [
            records.Transition(
                ob=kit.ob([]),
                ac=kit.action([], [], "stop"),
                reward=r,
                episode_done=i == len(steps) - 1,
            )
            for i, r in enumerate(steps)
        ]
        trajectories.append(
            records.Trajectory(transitions=transitions, final_ob=kit.ob([]), stop_reason=reason)
        )
    return trajectories


@pytest.mark.parametrize(
    ("policy_kwargs", "steps_G", "finals_G", "reasons_G"),
    [
        ({"zero_reward_on_limit": True}, [[0.5], [0.5], [0.25, 0.25]], [1.0, -2.0, 0.0], ["max_turns", "max_turns", "completed"]),
        ({"zero_reward_on_limit": True}, [[], [0.0], [1.0]], [0.5, 0.0, -1.0], ["max_tokens", "rollout_timeout", None]),
        ({"zero_reward_on_limit": True, "limit_stop_reasons": ("max_turns",)}, [[1.0], [1.0]], [0.0, 0.0], ["max_tokens", "max_turns"]),
        ({"zero_reward_on_limit": False}, [[1.0]], [1.0], ["max_turns"]),
        ({"zero_reward_on_limit": True, "skip_grading_on_timeout": True}, [[0.0], [0.0]], [0.0, 0.0], ["rollout_timeout", "rollout_timeout"]),
        ({"zero_reward_on_limit": True, "skip_grading_on_timeout": True}, [[0.0], [0.0]], [0.0, 0.0], ["rollout_timeout", "completed"]),
        ({"zero_reward_on_limit": True, "skip_grading_on_timeout": True, "limit_stop_reasons": ("max_turns",)}, [[0.0]], [0.0], ["rollout_timeout"]),
        ({"skip_grading_on_timeout": True}, [[0.0]], [0.0], ["rollout_timeout"]),
    ],
)  # fmt: skip
def test_termination_policy_agrees_with_the_cookbook_group_rollout(
    policy_kwargs, steps_G, finals_G, reasons_G
) -> None:
    require_cookbook()
    from tinker_cookbook.rl import rollout_limits, rollouts, types

    cookbook = _cookbook()
    theirs_policy = rollout_limits.TerminationRewardPolicy(**policy_kwargs)
    mine_policy = ours.TerminationRewardPolicy(**policy_kwargs)
    theirs_trajs = _group(cookbook, types, steps_G, reasons_G)
    mine_trajs = _group(OURS, ours_records, steps_G, reasons_G)

    assert ours.should_skip_group_grading(mine_policy, mine_trajs) == (
        rollouts._should_skip_group_grading(theirs_policy, theirs_trajs)
    )
    theirs_rewards, theirs_metrics = list(finals_G), [{"m": 1.0} for _ in finals_G]
    rollouts._apply_zero_reward_on_limit(
        theirs_policy, theirs_trajs, theirs_rewards, theirs_metrics
    )
    mine_rewards, mine_metrics = ours.apply_zero_reward_on_limit(
        mine_policy, mine_trajs, list(finals_G), [{"m": 1.0} for _ in finals_G]
    )
    assert mine_metrics == theirs_metrics
    # bit-equal, signed zeros included
    assert [(r, math.copysign(1.0, r)) for r in mine_rewards] == [
        (r, math.copysign(1.0, r)) for r in theirs_rewards
    ]
