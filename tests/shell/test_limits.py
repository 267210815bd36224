"""`shell.rollouts`' episode part: the policy records, the presets and `run_rollout` enforcing each limit."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import Literal

import numpy as np
import pytest
import tinker

from rlpure.records import (
    InitialObservationOverflow,
    ModelInput,
    StepResult,
    TokensWithLogprobs,
    Trajectory,
    Transition,
)
from shell.env import Env
from shell.errors import RlpureError
from shell.rollouts import (
    DEFAULT_LIMIT_STOP_REASONS,
    DEFAULT_RETRY_MESSAGE_TEMPLATE,
    TRUNCATION_METRIC_KEY,
    ParseErrorPolicy,
    RolloutConfig,
    RolloutLimits,
    RolloutState,
    SamplingTurnTimeoutError,
    TerminationRewardPolicy,
    agentic,
    apply_zero_reward_on_limit,
    default_rollout_config_for_model,
    model_defaults_to_agentic,
    run_rollout,
    should_skip_group_grading,
    simple,
)

# --- scripted policy and env -------------------------------------------------------------------


class Policy:
    """Samples `lengths[i]` tokens on call i (ids 100+), capped at the per-call `max_tokens`.

    A capped call reports `stop_reason="length"`. Records each call's `max_tokens` override
    (`"absent"` when the keyword was not passed) and the observation it saw.
    """

    def __init__(self, lengths: Sequence[int], *, delay: float = 0.0) -> None:
        self.lengths = list(lengths)
        self.delay = delay
        self.max_tokens_seen: list[int | str | None] = []
        self.obs_seen: list[list[int]] = []

    async def __call__(self, model_input, stop, **kwargs) -> TokensWithLogprobs:
        self.max_tokens_seen.append(kwargs.get("max_tokens", "absent"))
        self.obs_seen.append(model_input.to_ints())
        if self.delay:
            await asyncio.sleep(self.delay)
        n = self.lengths[len(self.obs_seen) - 1]
        cap = kwargs.get("max_tokens")
        stop_reason: Literal["stop", "length"] = "stop"
        if cap is not None and cap < n:
            n, stop_reason = cap, "length"
        tokens = list(range(100, 100 + n))
        return TokensWithLogprobs(tokens=tokens, logprobs=[-0.5] * n, stop_reason=stop_reason)


class MultiTurnEnv(Env):
    """Initial observation `prompt` tokens; each step appends the action and `feedback` tokens.

    Step `t` (1-based) rewards `t`, carries metric `turn=t`, and ends the episode at `turns`
    with `stop/completed`. The action and extra each step got are recorded.
    """

    def __init__(self, *, prompt: int = 4, feedback: int = 2, turns: int = 3) -> None:
        self.ob = list(range(1, prompt + 1))
        self.feedback = feedback
        self.turns = turns
        self.t = 0
        self.actions: list[object] = []
        self.extras: list[object] = []

    async def initial_observation(self):
        return ModelInput.from_ints(self.ob), [0]

    async def step(self, action, *, extra=None) -> StepResult:
        self.actions.append(action)
        self.extras.append(extra)
        self.t += 1
        self.ob = [*self.ob, *action, *([7] * self.feedback)]
        done = self.t >= self.turns
        metrics: dict[str, float] = {"turn": float(self.t)}
        if done:
            metrics["stop/completed"] = 1.0
        return StepResult(
            reward=float(self.t),
            episode_done=done,
            next_observation=ModelInput.from_ints(self.ob),
            next_stop_condition=[0],
            metrics=metrics,
            logs={"t": self.t},
        )


def rollout(policy, env, **kwargs) -> Trajectory:
    return asyncio.run(run_rollout(policy, env, **kwargs))


def stop_keys(transition: Transition) -> list[str]:
    return [k for k in transition.metrics if k.startswith("stop/")]


# --- the unconfigured loop ---------------------------------------------------------------------


def test_unconfigured_loop_runs_to_the_env_stop_with_list_actions_and_no_override():
    policy, env = Policy([3, 3, 3]), MultiTurnEnv(turns=3)
    traj = rollout(policy, env)
    assert [t.reward for t in traj.transitions] == [1.0, 2.0, 3.0]
    assert [t.episode_done for t in traj.transitions] == [False, False, True]
    assert traj.stop_reason == "completed"
    assert policy.max_tokens_seen == ["absent"] * 3  # no kwarg without a budget
    assert all(type(a) is list and all(type(x) is int for x in a) for a in env.actions)
    assert env.actions[0] == [100, 101, 102]
    assert env.extras == [{"stop_reason": "stop"}] * 3
    # each transition's ob is what the policy saw; final_ob is the env's last observation
    assert [t.ob.to_ints() for t in traj.transitions] == policy.obs_seen
    assert traj.final_ob.to_ints() == env.ob
    assert traj.transitions[0].logs == {"t": 1}


def test_a_policy_without_the_max_tokens_keyword_works_unconfigured():
    class Plain:
        async def __call__(self, model_input, stop):
            return TokensWithLogprobs(tokens=[5], logprobs=[-1.0])

    assert rollout(Plain(), MultiTurnEnv(turns=2)).stop_reason == "completed"


def test_tinker_model_input_observations_are_converted_before_the_policy():
    class TinkerEnv(MultiTurnEnv):
        async def initial_observation(self):
            return tinker.ModelInput.from_ints(self.ob), [0]

    policy = Policy([2])
    traj = rollout(policy, TinkerEnv(turns=1))
    assert isinstance(traj.transitions[0].ob, ModelInput)
    assert policy.obs_seen == [[1, 2, 3, 4]]


def test_initial_observation_overflow_is_one_synthetic_transition_and_no_sampling():
    class Overflow(Env):
        async def initial_observation(self):
            return InitialObservationOverflow(
                reward=-1.0, metrics={"stop/max_tokens": 1.0, "x": 2.0}, logs={"why": "long"}
            )

        async def step(self, action, *, extra=None):
            raise AssertionError("never stepped")

    policy = Policy([])
    traj = rollout(policy, Overflow())
    assert policy.obs_seen == []
    (only,) = traj.transitions
    assert only.ob.length == 0 and only.ac.tokens.size == 0
    assert only.episode_done and only.reward == -1.0
    assert only.metrics == {"stop/max_tokens": 1.0, "x": 2.0}
    assert only.logs == {"why": "long"}
    assert traj.stop_reason == "max_tokens"
    assert traj.final_ob.length == 0


# --- each limit --------------------------------------------------------------------------------


def test_max_turns_stops_before_the_next_turn_and_marks_the_last_transition():
    traj = rollout(Policy([3] * 5), MultiTurnEnv(turns=5), limits=RolloutLimits(max_turns=2))
    assert len(traj.transitions) == 2
    last = traj.transitions[-1]
    assert last.episode_done and traj.stop_reason == "max_turns"
    assert last.metrics == {"turn": 2.0, "stop/max_turns": 1.0}  # env metrics kept


def test_per_turn_budget_is_the_least_of_the_three_terms():
    # prompt 4; each turn adds the action (<= 3) and 2 feedback tokens.
    policy = Policy([3, 3, 3, 3])
    limits = RolloutLimits(max_turn_tokens=3, max_trajectory_tokens=14, max_sampled_tokens=9)
    traj = rollout(policy, MultiTurnEnv(turns=4), limits=limits)
    # turn 1: min(3, 14-4=10, 9-0=9) = 3; turn 2: min(3, 14-9=5, 9-3=6) = 3;
    # then ob = 14: trajectory remainder 0 -> max_tokens before turn 3.
    assert policy.max_tokens_seen == [3, 3]
    assert traj.stop_reason == "max_tokens"
    # a budget below the sampled length truncates the turn
    policy = Policy([5, 5])
    rollout(policy, MultiTurnEnv(turns=2), limits=RolloutLimits(max_trajectory_tokens=7))
    assert policy.max_tokens_seen == [3]  # 7 - 4; after it, ob = 9 > 7 -> stop


def test_an_initial_prompt_over_the_trajectory_budget_stops_with_an_empty_transition():
    policy = Policy([3])
    traj = rollout(policy, MultiTurnEnv(prompt=10), limits=RolloutLimits(max_trajectory_tokens=11))
    assert policy.obs_seen == []
    (only,) = traj.transitions
    assert only.ob.length == 0 and only.ac.tokens.size == 0 and only.reward == 0.0
    assert only.metrics == {"stop/max_tokens": 1.0}
    assert traj.stop_reason == "max_tokens" and traj.final_ob.length == 10


def test_trajectory_budget_wins_over_sampled_budget_when_both_are_exhausted():
    traj = rollout(
        Policy([3, 3]),
        MultiTurnEnv(turns=3),
        limits=RolloutLimits(max_trajectory_tokens=10, max_sampled_tokens=4),
    )
    # after turn 1: ob = 9 (remainder 1), sampled = 3 (remainder 1): both exhausted
    assert traj.stop_reason == "max_tokens"


def test_a_truncated_turn_that_exhausts_the_sampled_budget_reports_max_sampled_tokens():
    policy = Policy([3, 10, 3])
    traj = rollout(
        policy,
        MultiTurnEnv(turns=3),
        limits=RolloutLimits(max_turn_tokens=4, max_sampled_tokens=8),
    )
    # turn 1 samples 3; turn 2 is capped at min(4, 8-3=5) = 4 ("length", the env continues);
    # sampled = 7, remainder 1 -> max_sampled_tokens, with the truncation counted.
    assert policy.max_tokens_seen == [4, 4]
    assert [t.ac.stop_reason for t in traj.transitions] == ["stop", "length"]
    assert traj.stop_reason == "max_sampled_tokens"
    last = traj.transitions[-1]
    assert last.metrics[TRUNCATION_METRIC_KEY] == 1.0
    assert stop_keys(last) == ["stop/max_sampled_tokens"]
    assert "stop/max_sampled_tokens" not in traj.transitions[0].metrics


def test_length_stops_the_env_continues_past_are_counted_on_the_env_stop_too():
    policy = Policy([9, 9, 9])
    traj = rollout(policy, MultiTurnEnv(turns=3), limits=RolloutLimits(max_turn_tokens=2))
    assert traj.stop_reason == "completed"
    # the last turn ended the episode, so only two truncations were continued past
    assert traj.transitions[-1].metrics[TRUNCATION_METRIC_KEY] == 2.0
    assert TRUNCATION_METRIC_KEY not in traj.transitions[0].metrics


def test_max_turns_is_checked_before_the_token_budgets():
    traj = rollout(
        Policy([3, 3]),
        MultiTurnEnv(turns=3),
        limits=RolloutLimits(max_turns=1, max_trajectory_tokens=9),
    )
    assert traj.stop_reason == "max_turns"  # the trajectory budget is also exhausted


# --- timeouts ----------------------------------------------------------------------------------


def test_the_rollout_deadline_keeps_the_partial_trajectory():
    traj = rollout(
        Policy([2] * 10, delay=0.04),
        MultiTurnEnv(turns=10),
        limits=RolloutLimits(rollout_timeout_seconds=0.1),
    )
    assert 1 <= len(traj.transitions) < 10
    assert traj.stop_reason == "rollout_timeout"
    assert traj.transitions[-1].episode_done
    assert stop_keys(traj.transitions[-1]) == ["stop/rollout_timeout"]


def test_the_rollout_deadline_during_the_first_sample_gives_an_empty_transition():
    traj = rollout(
        Policy([2], delay=0.2), MultiTurnEnv(), limits=RolloutLimits(rollout_timeout_seconds=0.02)
    )
    (only,) = traj.transitions
    assert only.ac.tokens.size == 0 and only.metrics == {"stop/rollout_timeout": 1.0}
    assert traj.stop_reason == "rollout_timeout"


def test_a_slow_sampling_call_raises_sampling_turn_timeout_error():
    with pytest.raises(SamplingTurnTimeoutError, match=r"sampling_turn_timeout_seconds=0\.02"):
        rollout(
            Policy([2], delay=0.2),
            MultiTurnEnv(),
            limits=RolloutLimits(sampling_turn_timeout_seconds=0.02, rollout_timeout_seconds=5),
        )
    assert issubclass(SamplingTurnTimeoutError, RlpureError)
    assert not issubclass(SamplingTurnTimeoutError, TimeoutError)


def test_a_timeout_error_raised_by_the_env_is_not_the_rollout_deadline():
    class Flaky(MultiTurnEnv):
        async def step(self, action, *, extra=None):
            raise TimeoutError("grader timed out")

    with pytest.raises(TimeoutError, match="grader timed out"):
        rollout(Policy([2]), Flaky(), limits=RolloutLimits(rollout_timeout_seconds=5))


def test_a_timeout_error_raised_by_the_policy_is_not_a_turn_timeout():
    class Raising:
        async def __call__(self, model_input, stop, **kwargs):
            raise TimeoutError("sampler")

    with pytest.raises(TimeoutError, match="sampler"):
        rollout(Raising(), MultiTurnEnv(), limits=RolloutLimits(sampling_turn_timeout_seconds=5))


# --- hooks and seams ---------------------------------------------------------------------------


class Hooks:
    def __init__(self, *, decide=None, inject=None) -> None:
        self.decide = decide or (lambda reason, state: reason)
        self.inject = inject or (lambda state: None)
        self.calls: list[tuple[str, object]] = []

    async def on_turn_begin(self, state: RolloutState):
        self.calls.append(("turn_begin", state.turn_index))
        return self.inject(state)

    async def on_stop_reason(self, reason, state):
        self.calls.append(("stop", str(reason)))
        return self.decide(str(reason), state)

    async def on_grade(self, state):
        self.calls.append(("grade", state.turn_index))

    async def on_artifacts(self, state):
        self.calls.append(("artifacts", len(state.transitions)))


def test_hooks_see_each_turn_and_the_end_of_an_env_stop():
    hooks = Hooks()
    rollout(Policy([1, 1]), MultiTurnEnv(turns=2), hooks=hooks)
    assert hooks.calls == [
        ("turn_begin", 0),
        ("turn_begin", 1),
        ("stop", "completed"),
        ("grade", 2),
        ("artifacts", 2),
    ]


def test_a_runner_stop_is_not_graded():
    hooks = Hooks()
    rollout(Policy([1, 1]), MultiTurnEnv(turns=3), limits=RolloutLimits(max_turns=1), hooks=hooks)
    assert ("grade", 1) not in hooks.calls and hooks.calls[-1] == ("artifacts", 1)


def test_a_hook_overrides_the_env_stop_reason_keeping_one_stop_metric():
    hooks = Hooks(decide=lambda reason, state: "custom")
    traj = rollout(Policy([1]), MultiTurnEnv(turns=1), hooks=hooks)
    assert traj.stop_reason == "custom"
    assert traj.transitions[-1].metrics == {"turn": 1.0, "stop/custom": 1.0}


def test_a_hook_clearing_the_env_stop_continues_from_the_next_observation():
    cleared: list[str] = []

    def decide(reason, state):
        if not cleared:
            cleared.append(reason)
            return None
        return reason

    class Continuing(MultiTurnEnv):  # keeps answering after its "end"
        pass

    policy = Policy([1, 1])
    traj = rollout(policy, Continuing(turns=1), hooks=Hooks(decide=decide))
    assert len(traj.transitions) == 2
    first = traj.transitions[0]
    assert not first.episode_done and stop_keys(first) == []
    assert traj.stop_reason == "completed"


def test_a_hook_clearing_a_budget_stop_samples_without_the_exhausted_term():
    decisions = iter([None, "max_tokens"])
    policy = Policy([3, 3, 3])
    traj = rollout(
        policy,
        MultiTurnEnv(turns=3),
        limits=RolloutLimits(max_trajectory_tokens=9, max_turn_tokens=5),
        hooks=Hooks(decide=lambda reason, state: next(decisions)),
    )
    # turn 1: min(5, 9-4=5); ob 9: exhausted, cleared -> turn 2 capped at max_turn_tokens only
    assert policy.max_tokens_seen == [5, 5]
    assert traj.stop_reason == "max_tokens" and len(traj.transitions) == 2


def test_injected_messages_need_an_env_that_supports_injection():
    hooks = Hooks(inject=lambda state: [{"role": "user", "content": "hi"}])
    with pytest.raises(TypeError, match=r"MultiTurnEnv\) does not support message injection"):
        rollout(Policy([1]), MultiTurnEnv(), hooks=hooks)


def test_injected_tokens_count_toward_the_trajectory_budget():
    class Injectable(MultiTurnEnv):
        async def inject_messages(self, messages):
            self.ob = [*self.ob, *([8] * 3 * len(messages))]
            return tinker.ModelInput.from_ints(self.ob), [0]

    hooks = Hooks(inject=lambda state: [{"role": "user", "content": "hi"}])
    policy = Policy([2, 2])
    rollout(
        policy, Injectable(turns=2), hooks=hooks, limits=RolloutLimits(max_trajectory_tokens=20)
    )
    assert policy.obs_seen[0] == [1, 2, 3, 4, 8, 8, 8]
    assert policy.max_tokens_seen == [20 - 7, 20 - 7 - 2 - 2 - 3]


def test_tool_call_limit_and_parse_error_policy_are_pushed_into_envs_that_take_them(caplog):
    class Seams(MultiTurnEnv):
        def set_max_tool_calls(self, n):
            self.max_tool_calls = n

        def set_parse_error_policy(self, policy):
            self.parse_policy = policy

    env, policy = Seams(turns=1), ParseErrorPolicy(max_consecutive=2)
    rollout(Policy([1]), env, limits=RolloutLimits(max_tool_calls=3), parse_errors=policy)
    assert env.max_tool_calls == 3 and env.parse_policy is policy
    with caplog.at_level(logging.WARNING, logger="shell.rollouts._episode"):
        rollout(
            Policy([1]),
            MultiTurnEnv(turns=1),
            limits=RolloutLimits(max_tool_calls=3),
            parse_errors=policy,
        )
    text = caplog.text
    assert "max_tool_calls=3 is configured" in text and "ParseErrorPolicy is configured" in text


def test_config_and_env_rollout_limits_fill_in_missing_arguments():
    cfg = RolloutConfig(limits=RolloutLimits(max_turns=1))
    assert rollout(Policy([1, 1]), MultiTurnEnv(), config=cfg).stop_reason == "max_turns"
    # explicit limits win over the config's
    explicit = RolloutLimits(max_turns=2)
    traj = rollout(Policy([1, 1, 1]), MultiTurnEnv(), config=cfg, limits=explicit)
    assert len(traj.transitions) == 2
    env = MultiTurnEnv()
    env.rollout_limits = RolloutLimits(max_turns=1)  # type: ignore[attr-defined]
    assert rollout(Policy([1, 1]), env).stop_reason == "max_turns"


# --- records, validation and presets -----------------------------------------------------------


def test_defaults_change_nothing():
    limits = RolloutLimits()
    assert all(
        getattr(limits, f) is None
        for f in (
            "max_turns",
            "max_trajectory_tokens",
            "max_sampled_tokens",
            "max_tool_calls",
            "max_turn_tokens",
            "rollout_timeout_seconds",
            "sampling_turn_timeout_seconds",
        )
    )
    policy = ParseErrorPolicy()
    assert (policy.max_consecutive, policy.penalty_per_error, policy.terminal_reward) == (0, 0, 0)
    assert policy.retry_message_template == DEFAULT_RETRY_MESSAGE_TEMPLATE
    assert not policy.mask_error_turns
    term = TerminationRewardPolicy()
    assert (
        term.limit_stop_reasons
        == DEFAULT_LIMIT_STOP_REASONS
        == (
            "max_tokens",
            "max_sampled_tokens",
            "max_turns",
            "max_tool_calls",
            "rollout_timeout",
        )
    )
    assert not (term.zero_reward_on_limit or term.skip_grading_on_timeout)
    assert term.grader_timeout_seconds is None and not term.pass_all_messages_to_grader
    assert simple() == RolloutConfig() and RolloutConfig().tool_execution == "parallel"


@pytest.mark.parametrize(
    ("record", "kwargs", "error", "message"),
    [
        (RolloutLimits, {"max_turns": 0}, ValueError, "RolloutLimits.max_turns must be a positive value or None (unlimited), got 0"),
        (RolloutLimits, {"max_trajectory_tokens": -3}, ValueError, "RolloutLimits.max_trajectory_tokens must be a positive"),
        (RolloutLimits, {"rollout_timeout_seconds": 0.0}, ValueError, "RolloutLimits.rollout_timeout_seconds must be a positive"),
        (RolloutLimits, {"max_turns": "5"}, TypeError, "RolloutLimits.max_turns: expected an int or None, got str"),
        (RolloutLimits, {"max_turns": 2.5}, TypeError, "RolloutLimits.max_turns: expected an int or None, got float"),
        (RolloutLimits, {"max_turns": True}, TypeError, "RolloutLimits.max_turns: expected an int or None, got bool"),
        (ParseErrorPolicy, {"max_consecutive": -1}, ValueError, "ParseErrorPolicy.max_consecutive must be non-negative, got -1"),
        (ParseErrorPolicy, {"penalty_per_error": -0.5}, ValueError, "ParseErrorPolicy.penalty_per_error must be non-negative, got -0.5"),
        (ParseErrorPolicy, {"retry_message_template": "fix it"}, ValueError, "ParseErrorPolicy.retry_message_template must contain the '{details}' placeholder, got 'fix it'"),
        (ParseErrorPolicy, {"terminal_reward": float("nan")}, ValueError, "ParseErrorPolicy.terminal_reward: expected a number, got nan"),
        (TerminationRewardPolicy, {"grader_timeout_seconds": -1}, ValueError, "TerminationRewardPolicy.grader_timeout_seconds must be a positive"),
        (TerminationRewardPolicy, {"limit_stop_reasons": "max_turns"}, TypeError, "TerminationRewardPolicy.limit_stop_reasons: expected a tuple of stop reasons"),
        (TerminationRewardPolicy, {"zero_reward_on_limit": 1}, TypeError, "TerminationRewardPolicy.zero_reward_on_limit: expected a bool"),
        (RolloutConfig, {"tool_execution": "threads"}, ValueError, "RolloutConfig.tool_execution: expected one of 'sequential', 'parallel', 'concurrent_safe', got 'threads'"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_naming_the_record_and_field(record, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        record(**kwargs)


def test_agentic_preset_and_model_defaults():
    cfg = agentic()
    assert (cfg.limits.max_turns, cfg.limits.max_trajectory_tokens, cfg.limits.max_tool_calls) == (
        10,
        65536,
        30,
    )
    assert cfg.parse_errors == ParseErrorPolicy(max_consecutive=2)
    assert cfg.termination == TerminationRewardPolicy(
        zero_reward_on_limit=True, skip_grading_on_timeout=True, grader_timeout_seconds=900
    )
    assert cfg.tool_execution == "sequential"
    assert default_rollout_config_for_model("thinkingmachines/Inkling-2:peft:131072") == agentic()
    assert default_rollout_config_for_model("Qwen/Qwen3-8B") == simple()
    assert not model_defaults_to_agentic("someone/thinkingmachines/Inkling")


def _traj(rewards: Sequence[float], stop_reason: str | None) -> Trajectory:
    empty = TokensWithLogprobs(tokens=np.zeros(0, np.int32), logprobs=np.zeros(0, np.float32))
    return Trajectory(
        transitions=[
            Transition(
                ob=ModelInput.empty(), ac=empty, reward=r, episode_done=i == len(rewards) - 1
            )
            for i, r in enumerate(rewards)
        ],
        stop_reason=stop_reason,
    )


def test_termination_policy_grades_then_clamps_limit_stopped_trajectories():
    trajs = [_traj([0.25], "max_turns"), _traj([0.5], "max_turns"), _traj([1.0], "completed")]
    rewards, metrics = [1.0, -2.0, 1.0], [{"m": 1.0}, {}, {}]
    term = TerminationRewardPolicy(zero_reward_on_limit=True)
    new_rewards, new_metrics = apply_zero_reward_on_limit(term, trajs, rewards, metrics)
    assert new_rewards == [-0.25, -2.0, 1.0]
    assert new_metrics == [{"m": 1.0, "zero_reward_on_limit": 1.0}, {}, {}]
    assert rewards == [1.0, -2.0, 1.0] and metrics[0] == {"m": 1.0}  # inputs untouched
    off = apply_zero_reward_on_limit(TerminationRewardPolicy(), trajs, rewards, metrics)
    assert off == (rewards, metrics)


def test_grading_is_skipped_only_when_every_member_timed_out():
    term = TerminationRewardPolicy(zero_reward_on_limit=True, skip_grading_on_timeout=True)
    timed_out = [_traj([0.0], "rollout_timeout")] * 2
    assert should_skip_group_grading(term, timed_out)
    assert not should_skip_group_grading(term, [*timed_out, _traj([0.0], "completed")])
    assert not should_skip_group_grading(None, timed_out)
    assert not should_skip_group_grading(term, [])


def test_the_per_turn_budget_reaches_the_sampler_through_tinker_token_completer():
    from shell.completion import TinkerTokenCompleter
    from shell.fakes import FakeSamplingClient

    client = FakeSamplingClient(vocab_size=8)
    policy = TinkerTokenCompleter(client, max_tokens=16)
    traj = rollout(
        policy,
        MultiTurnEnv(turns=3),
        limits=RolloutLimits(max_turn_tokens=6, max_trajectory_tokens=16),
    )
    caps = [params.max_tokens for _, _, params in client.sample_calls]
    assert caps[0] == 6  # min(16 own, 6 turn, 16 - 4 trajectory)
    assert all(c is not None and c <= 6 for c in caps)
    assert all(t.ac.tokens.size <= 6 for t in traj.transitions)
    assert traj.transitions[-1].episode_done


def test_records_take_chz_command_line_overrides_nested_in_a_config():
    import chz

    @chz.chz
    class Config:
        rollout: RolloutConfig = chz.field(default_factory=RolloutConfig)
        termination: TerminationRewardPolicy | None = None

    cfg = chz.Blueprint(Config).make_from_argv(
        [
            "rollout.limits.max_turns=4",
            "rollout.limits.rollout_timeout_seconds=2.5",
            "rollout.tool_execution=sequential",
            "termination.zero_reward_on_limit=True",
        ]
    )
    assert cfg.rollout.limits == RolloutLimits(max_turns=4, rollout_timeout_seconds=2.5)
    assert cfg.rollout.tool_execution == "sequential"
    assert cfg.termination == TerminationRewardPolicy(zero_reward_on_limit=True)
    with pytest.raises(ValueError, match=r"RolloutLimits\.max_turns must be a positive value"):
        chz.Blueprint(Config).make_from_argv(["rollout.limits.max_turns=0"])


def test_hooks_subclassing_rollout_hooks_inherit_the_no_op_defaults():
    from shell.rollouts import RolloutHooks

    class OnlyArtifacts(RolloutHooks):
        def __init__(self) -> None:
            self.artifacts: list[int] = []

        async def on_artifacts(self, state: RolloutState) -> None:
            self.artifacts.append(len(state.transitions))

    hooks = OnlyArtifacts()
    traj = rollout(Policy([1, 1]), MultiTurnEnv(turns=2), hooks=hooks)
    assert traj.stop_reason == "completed" and hooks.artifacts == [2]
