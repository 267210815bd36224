"""Tests for rollouts and failure strategies (`shell.rollouts`) with scripted fakes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from returns.result import Failure, Success

from rlpure.records import StepResult
from shell.env import Action, ActionExtra, Env
from shell.errors import (
    AllTrajectoriesFailedError,
    BelowMinViableGroupError,
    ConfigError,
    EnvFailure,
    GroupRolloutError,
    RlpureError,
)
from shell.fakes import ScriptedEnv, ScriptedGroupBuilder, ScriptedPolicy
from shell.fakes._sdk import FakeSamplingClient
from shell.rollouts import (
    FailFast,
    GroupFailure,
    MinViableGroup,
    RetryOnFailure,
    RolloutErrorCounter,
    RolloutResult,
    RolloutStrategy,
    TerminationRewardPolicy,
    batch_rollout_error_metrics,
    default_rollout_strategy_for_model,
    do_batch_rollouts,
    do_group_rollout,
    do_group_rollout_and_filter_constant_reward,
    do_single_rollout,
    min_viable_floor,
    rollout_strategy_from_config,
)

POLICY = ScriptedPolicy(actions=[[7, 8]])


def _builder(
    group_size: int,
    *,
    failing: Sequence[int] = (),
    hanging: Sequence[int] = (),
    error: Callable[[int], BaseException] | None = None,
    **kwargs: object,
) -> ScriptedGroupBuilder:
    """Env `i` (creation index) has prompt `[i]`; listed indices fail or hang at step 0."""

    def make(i: int) -> Env:
        return ScriptedEnv(
            prompt=[i],
            rewards=[0.5],
            fail_at_step=0 if i in failing else None,
            error=None if error is None else error(i),
            hang_at_step=0 if i in hanging else None,
        )

    return ScriptedGroupBuilder(make, group_size=group_size, **kwargs)  # type: ignore[arg-type]


def _run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def _created(builder: ScriptedGroupBuilder) -> list[ScriptedEnv]:
    return [e for e in builder.envs if isinstance(e, ScriptedEnv)]


# --- single rollouts -------------------------------------------------------------------------


def test_single_rollout_records_every_turn_with_the_prefix_property() -> None:
    env = ScriptedEnv(prompt=[1, 2], rewards=[0.25, 1.0], metrics={"stop/max_turns": 1.0})
    policy = ScriptedPolicy(actions=[[3], [4, 5]], logprob=-0.5)
    traj = _run(do_single_rollout(policy, env))
    assert [t.ob.to_ints() for t in traj.transitions] == [[1, 2], [1, 2, 3]]
    assert [t.ac.tokens.tolist() for t in traj.transitions] == [[3], [4, 5]]
    assert [t.ac.logprobs.tolist() for t in traj.transitions] == [[-0.5], [-0.5, -0.5]]
    assert [t.reward for t in traj.transitions] == [0.25, 1.0]
    assert [t.episode_done for t in traj.transitions] == [False, True]
    assert traj.final_ob.to_ints() == [1, 2, 3, 4, 5]
    assert traj.stop_reason == "max_turns"
    assert traj.transitions[0].metrics == {"stop/max_turns": 1.0}
    assert policy.calls[1] == ([1, 2, 3], (0,))


def test_a_single_stop_string_is_one_stop_not_its_characters() -> None:
    # `tinker.SamplingParams.stop` takes a str; `tuple(stop)` made ('<', '/', 'a', ...), so
    # sampling stopped at the first 'a'
    env = ScriptedEnv(prompt=[1, 2], rewards=[1.0], stop="</answer>")  # type: ignore[arg-type]
    policy = ScriptedPolicy(actions=[[3]])
    _run(do_single_rollout(policy, env))
    assert policy.calls[0] == ([1, 2], ("</answer>",))


def test_group_rewards_are_added_to_step_rewards() -> None:
    builder = _builder(3, group_rewards=[1.0, 2.0, -1.0])
    group = _run(do_group_rollout(builder, POLICY))
    assert group.final_rewards_G == (1.0, 2.0, -1.0)
    assert group.get_total_rewards() == [1.5, 2.5, -0.5]
    assert group.metrics_G == ({"group_reward": 1.0}, {"group_reward": 2.0}, {"group_reward": -1.0})
    assert group.rollout_errors == ()
    assert builder.cleanup_calls == 1


def test_group_rollout_runs_envs_concurrently_in_slot_order() -> None:
    def make(i: int) -> Env:
        # later envs finish first; slots must still follow make_envs order
        return ScriptedEnv(prompt=[i], rewards=[float(i)], latency=0.2 * (4 - i))

    builder = ScriptedGroupBuilder(make, group_size=4)
    loop = asyncio.new_event_loop()
    start = loop.time()
    group = loop.run_until_complete(do_group_rollout(builder, POLICY))
    elapsed = loop.time() - start
    loop.close()
    assert [t.transitions[0].ob.to_ints() for t in group.trajectories_G] == [[0], [1], [2], [3]]
    # Concurrent: about the slowest (0.8 s), far from the sum (2.0 s); wide margin for load.
    assert elapsed < 1.4


# --- FailFast --------------------------------------------------------------------------------


def test_fail_fast_raises_the_first_error_and_cancels_its_siblings() -> None:
    builder = _builder(4, failing=[1], hanging=[0, 2, 3])
    with pytest.raises(EnvFailure, match="scripted failure"):
        _run(do_group_rollout(builder, POLICY, strategy=FailFast()))
    envs = _created(builder)
    assert [e.cancelled for e in envs] == [True, False, True, True]
    assert builder.cleanup_calls == 1
    assert builder.make_envs_calls == 1


def test_fail_fast_propagates_programming_errors_unchanged() -> None:
    builder = _builder(2, failing=[0], error=lambda i: TypeError("bug in env"))
    with pytest.raises(TypeError, match="bug in env"):
        _run(do_group_rollout(builder, POLICY))
    assert builder.cleanup_calls == 1


# --- RetryOnFailure --------------------------------------------------------------------------


def test_retry_on_failure_recovers_with_a_fresh_env_in_the_same_slot() -> None:
    builder = _builder(4, failing=[0, 2])
    group = _run(do_group_rollout(builder, POLICY, strategy=RetryOnFailure(max_retries=2)))
    assert len(group.trajectories_G) == 4
    # slots 0 and 2 were refilled by fresh envs (creation indices 4 and 8)
    first_obs = [t.transitions[0].ob.to_ints()[0] for t in group.trajectories_G]
    assert first_obs == [4, 1, 8, 3]
    assert [e.error_type for e in group.rollout_errors] == ["EnvFailure", "EnvFailure"]
    assert builder.make_envs_calls == 3
    assert builder.cleanup_calls == 1


def test_retry_on_failure_fails_the_whole_group_when_the_budget_is_spent() -> None:
    # The cookbook re-raises the failure that found the budget spent; a note lists them all.
    builder = _builder(4, failing=[0, 1], hanging=[2, 3])
    with pytest.raises(EnvFailure, match="scripted failure") as info:
        _run(do_group_rollout(builder, POLICY, strategy=RetryOnFailure(max_retries=1)))
    assert info.value.__notes__ == [
        "RetryOnFailure: retry budget spent (2 failures, max_retries=1): "
        "EnvFailure: scripted failure at 0, EnvFailure: scripted failure at 0"
    ]
    assert builder.make_envs_calls == 2
    envs = _created(builder)
    assert envs[2].cancelled and envs[3].cancelled  # all-or-nothing: siblings cancelled
    assert builder.cleanup_calls == 1


def test_retry_on_failure_retries_a_timed_out_rollout() -> None:
    builder = _builder(2, hanging=[0])
    strategy = RetryOnFailure(max_retries=1, per_rollout_timeout=0.05)
    group = _run(do_group_rollout(builder, POLICY, strategy=strategy))
    # the cookbook's error type (its metric key is rollout_errors/TimeoutError), our message
    assert [e.error_type for e in group.rollout_errors] == ["TimeoutError"]
    assert group.rollout_errors[0].error_message == (
        "rollout exceeded its per_rollout_timeout of 0.05 s"
    )
    assert [t.transitions[0].ob.to_ints()[0] for t in group.trajectories_G] == [2, 1]
    assert _created(builder)[0].cancelled
    assert builder.cleanup_calls == 1


def test_retry_on_failure_times_out_all_or_nothing_when_no_budget_is_left() -> None:
    builder = _builder(3, hanging=[0, 1, 2])
    strategy = RetryOnFailure(max_retries=0, per_rollout_timeout=0.05)
    with pytest.raises(TimeoutError, match=r"per_rollout_timeout of 0\.05 s"):
        _run(do_group_rollout(builder, POLICY, strategy=strategy))
    assert builder.cleanup_calls == 1


@pytest.mark.parametrize(
    "error",
    [AttributeError("typo"), KeyError("k"), RuntimeError("sandbox"), FileNotFoundError("x")],
    ids=lambda e: type(e).__name__,
)
def test_retry_on_failure_retries_any_exception_as_the_cookbook(error: Exception) -> None:
    builder = _builder(3, failing=[1], error=lambda i: error)
    group = _run(do_group_rollout(builder, POLICY, strategy=RetryOnFailure(max_retries=1)))
    assert [e.error_type for e in group.rollout_errors] == [type(error).__name__]
    assert len(group.trajectories_G) == 3
    assert builder.make_envs_calls == 2


@pytest.mark.parametrize("strategy", [RetryOnFailure(max_retries=5), MinViableGroup(max_retries=5)])
def test_config_errors_are_not_rollout_failures(strategy: RolloutStrategy) -> None:
    builder = _builder(3, failing=[1], error=lambda i: ConfigError("bad option"), hanging=[0, 2])
    with pytest.raises(ConfigError, match="bad option"):
        _run(do_group_rollout(builder, POLICY, strategy=strategy))
    assert builder.make_envs_calls == 1  # not retried
    assert builder.cleanup_calls == 1
    assert _created(builder)[0].cancelled and _created(builder)[2].cancelled
    # and a skipping caller does not skip the group either
    with pytest.raises(ConfigError):
        _run(
            do_batch_rollouts(
                [_builder(2, failing=[0], error=lambda i: ConfigError("x"))],
                POLICY,
                strategy=strategy,
            )
        )


def test_fatal_types_are_configurable_and_empty_is_the_cookbook() -> None:
    builder = _builder(2, failing=[0], error=lambda i: ConfigError("bad option"))
    group = _run(do_group_rollout(builder, POLICY, strategy=RetryOnFailure(1, fatal=())))
    assert [e.error_type for e in group.rollout_errors] == ["ConfigError"]
    builder = _builder(2, failing=[0], error=lambda i: TypeError("bug"), hanging=[1])
    with pytest.raises(TypeError):
        _run(do_group_rollout(builder, POLICY, strategy=RetryOnFailure(fatal=(TypeError,))))
    assert builder.make_envs_calls == 1


@settings(max_examples=30, deadline=None)
@given(
    group_size=st.integers(1, 5),
    max_retries=st.integers(0, 3),
    failing=st.sets(st.integers(0, 12), max_size=8),
)
def test_retry_on_failure_is_all_or_nothing(
    group_size: int, max_retries: int, failing: set[int]
) -> None:
    builder = _builder(group_size, failing=sorted(failing))
    strategy = RetryOnFailure(max_retries=max_retries)
    try:
        group = _run(do_group_rollout(builder, POLICY, strategy=strategy))
    except EnvFailure as err:
        assert f"({max_retries + 1} failures, max_retries={max_retries})" in err.__notes__[0]
        assert builder.make_envs_calls == 1 + max_retries
    else:
        assert len(group.trajectories_G) == group_size
        assert len(group.rollout_errors) <= max_retries
        assert builder.make_envs_calls == 1 + len(group.rollout_errors)
        assert not {t.transitions[0].ob.to_ints()[0] for t in group.trajectories_G} & failing
    assert builder.cleanup_calls == 1


# --- MinViableGroup --------------------------------------------------------------------------


@pytest.mark.parametrize(("group_size", "floor"), [(1, 1), (2, 2), (4, 3), (8, 6), (16, 12)])
def test_min_viable_floor_is_ceil_three_quarters(group_size: int, floor: int) -> None:
    assert min_viable_floor(group_size) == floor
    assert min_viable_floor(group_size, min_successful=2) == 2


@pytest.mark.parametrize(("group_size", "floor"), [(4, 3), (8, 6)])
def test_min_viable_group_accepts_a_partial_group_at_the_floor(group_size: int, floor: int) -> None:
    failing = list(range(group_size - floor))
    builder = _builder(group_size, failing=failing)
    group = _run(do_group_rollout(builder, POLICY, strategy=MinViableGroup(max_retries=0)))
    assert len(group.trajectories_G) == floor
    assert len(group.final_rewards_G) == len(group.metrics_G) == floor
    assert len(group.rollout_errors) == group_size - floor
    assert builder.cleanup_calls == 1


@pytest.mark.parametrize(("group_size", "floor"), [(4, 3), (8, 6)])
def test_min_viable_group_drops_a_group_below_the_floor(group_size: int, floor: int) -> None:
    builder = _builder(group_size, failing=list(range(group_size - floor + 1)))
    with pytest.raises(BelowMinViableGroupError) as info:
        _run(do_group_rollout(builder, POLICY, strategy=MinViableGroup(max_retries=0)))
    assert len(info.value.errors) == group_size - floor + 1
    assert builder.cleanup_calls == 1


def test_min_viable_group_retries_only_below_the_floor() -> None:
    # 8 envs: 0..2 fail at once (floor 6 unmet: 3 retries spent) ...
    builder = _builder(8, failing=[0, 1, 2])
    group = _run(do_group_rollout(builder, POLICY, strategy=MinViableGroup(max_retries=3)))
    assert len(group.trajectories_G) == 8
    assert builder.make_envs_calls == 4

    # ... but once 6 succeeded a failure is accepted without a retry.
    def make(i: int) -> Env:
        return ScriptedEnv(
            prompt=[i],
            rewards=[1.0],
            latency=0.05 if i == 7 else 0.0,
            fail_at_step=0 if i == 7 else None,
        )

    late = ScriptedGroupBuilder(make, group_size=8)
    group = _run(do_group_rollout(late, POLICY, strategy=MinViableGroup(max_retries=3)))
    assert len(group.trajectories_G) == 7
    assert late.make_envs_calls == 1


# --- cleanup and cancellation ----------------------------------------------------------------

STRATEGIES: list[RolloutStrategy] = [
    FailFast(),
    RetryOnFailure(max_retries=1),
    MinViableGroup(max_retries=1),
]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize(
    "path",
    ["success", "rollout_error", "make_envs_error", "rewards_error", "config_error", "cancelled"],
)
def test_cleanup_is_called_exactly_once_in_every_path(strategy: RolloutStrategy, path: str) -> None:
    kwargs: dict[str, object] = {}
    if path == "rollout_error":
        kwargs["failing"] = list(range(20))
    elif path == "make_envs_error":
        kwargs["make_envs_error"] = OSError("no sandbox")
    elif path == "rewards_error":
        kwargs["rewards_error"] = EnvFailure("grader down")
    elif path == "config_error":
        kwargs["failing"] = [0]
        kwargs["error"] = lambda i: ConfigError("oops")
    elif path == "cancelled":
        kwargs["hanging"] = list(range(20))
    builder = _builder(4, **kwargs)  # type: ignore[arg-type]

    async def main() -> None:
        task = asyncio.create_task(do_group_rollout(builder, POLICY, strategy=strategy))
        if path == "cancelled":
            await asyncio.sleep(0.02)
            task.cancel()
        await task

    if path == "success":
        _run(main())
    else:
        expected: type[BaseException] = {
            "rollout_error": RlpureError,
            "make_envs_error": OSError,
            "rewards_error": EnvFailure,
            "config_error": ConfigError,
            "cancelled": asyncio.CancelledError,
        }[path]
        with pytest.raises(expected):
            _run(main())
    assert builder.cleanup_calls == 1
    if path == "cancelled":
        assert all(e.cancelled for e in _created(builder))


def test_cancelling_a_batch_propagates_and_cleans_every_group_once() -> None:
    builders = [_builder(2, hanging=[0, 1]) for _ in range(3)]

    async def main() -> None:
        task = asyncio.create_task(
            do_batch_rollouts(builders, POLICY, strategy=RetryOnFailure(max_retries=3))
        )
        await asyncio.sleep(0.02)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        _run(main())
    assert [b.cleanup_calls for b in builders] == [1, 1, 1]


# --- batches ---------------------------------------------------------------------------------


def test_batch_under_a_tolerant_strategy_skips_and_counts_failed_groups() -> None:
    builders = [
        _builder(2),
        _builder(2, failing=[0, 1, 2]),  # budget 1: fails after two errors
        _builder(2, make_envs_error=ConnectionError("refused")),
        _builder(2, failing=[1]),  # recovers
    ]
    outcomes = _run(do_batch_rollouts(builders, POLICY, strategy=RetryOnFailure(max_retries=1)))
    assert [type(o) for o in outcomes] == [Success, Failure, Failure, Success]
    failure = outcomes[1].failure()
    assert isinstance(failure, GroupFailure)
    assert failure.error_type == "EnvFailure"
    assert [e.error_type for e in failure.errors] == ["EnvFailure"]
    assert outcomes[2].failure().error_type == "ConnectionError"
    # The cookbook's RolloutErrorCounter: a skipped group counts once in groups_skipped, its
    # trajectory errors are not counted; errors of kept groups are.
    assert batch_rollout_error_metrics(outcomes) == {
        "rollout_errors/EnvFailure": 1.0,
        "rollout_errors/total": 1.0,
        "rollout_errors/groups_skipped": 2.0,
    }
    assert [b.cleanup_calls for b in builders] == [1, 1, 1, 1]


def test_batch_under_fail_fast_raises_and_cancels_the_other_groups() -> None:
    builders = [_builder(2, hanging=[0, 1]), _builder(2, failing=[1]), _builder(2, hanging=[0])]
    with pytest.raises(EnvFailure):
        _run(do_batch_rollouts(builders, POLICY, strategy=FailFast()))
    assert [b.cleanup_calls for b in builders] == [1, 1, 1]
    assert all(e.cancelled for e in _created(builders[0]))


def test_batch_respects_the_concurrency_bound() -> None:
    active = 0
    peak = 0

    class Counting(ScriptedGroupBuilder):
        async def make_envs(self) -> Sequence[Env]:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            return await super().make_envs()

        async def cleanup(self) -> None:
            nonlocal active
            active -= 1
            await super().cleanup()

    def make(i: int) -> Env:
        return ScriptedEnv(prompt=[i], latency=0.01)

    builders = [Counting(make, group_size=2) for _ in range(7)]
    outcomes = _run(do_batch_rollouts(builders, POLICY, max_concurrent_groups=2))
    assert peak == 2 and len(outcomes) == 7
    peak = 0
    _run(do_batch_rollouts(builders, POLICY))
    assert peak == 7


def test_rollout_error_metrics_is_empty_without_errors() -> None:
    outcomes = _run(do_batch_rollouts([_builder(2)], POLICY))
    assert batch_rollout_error_metrics(outcomes) == {}


@pytest.mark.parametrize(
    "make",
    [
        lambda: RetryOnFailure(max_retries=-1),
        lambda: RetryOnFailure(per_rollout_timeout=-1.0),
        lambda: MinViableGroup(min_successful=0),
        lambda: MinViableGroup(per_rollout_timeout=0),
        lambda: MinViableGroup(max_retries=-1),
        lambda: FailFast(per_rollout_timeout=0.0),
    ],
)
def test_strategies_validate_their_options(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        make()


def test_empty_group_is_refused() -> None:
    with pytest.raises(ValueError, match="returned no envs"):
        _run(do_group_rollout(_builder(0), POLICY))


def test_scripted_policy_failures_are_rollout_failures() -> None:
    policy = ScriptedPolicy(fail_at={0: TimeoutError("sampler timed out")})
    builder = _builder(2)
    group = _run(do_group_rollout(builder, policy, strategy=RetryOnFailure(max_retries=1)))
    assert [e.error_type for e in group.rollout_errors] == ["TimeoutError"]
    assert np.all([len(t.transitions) == 1 for t in group.trajectories_G])


# --- review findings: cleanup never masks the real error -----------------------------------


def test_a_failing_cleanup_does_not_replace_the_error_that_is_propagating() -> None:
    builder = ScriptedGroupBuilder(
        lambda i: ScriptedEnv(fail_at_step=0, error=KeyError("the real bug")),
        group_size=2,
        cleanup_error=ConnectionResetError("cleanup boom"),
    )
    for strategy in (FailFast(), RetryOnFailure(max_retries=2)):
        with pytest.raises(KeyError, match="the real bug") as info:
            asyncio.run(do_group_rollout(builder, POLICY, strategy=strategy))
        assert (
            "ScriptedGroupBuilder.cleanup also failed: ConnectionResetError: cleanup boom"
            in info.value.__notes__
        )


def test_a_failing_cleanup_after_success_is_raised() -> None:
    builder = ScriptedGroupBuilder(
        lambda i: ScriptedEnv(), group_size=2, cleanup_error=ConnectionResetError("boom")
    )
    with pytest.raises(ConnectionResetError, match="boom"):
        asyncio.run(do_group_rollout(builder, POLICY))
    assert builder.cleanup_calls == 1


# --- issue 11: the cookbook's semantics ------------------------------------------------------


class _ListCheckingEnv(ScriptedEnv):
    """Fails unless the action arrives as a `list[int]` (cookbook envs do `if not tokens`)."""

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        assert type(action) is list and all(type(t) is int for t in action), type(action)
        if not action:
            raise AssertionError("empty action")
        return await super().step(action, extra=extra)


def test_actions_reach_env_step_as_a_list_of_ints() -> None:
    traj = _run(do_single_rollout(POLICY, _ListCheckingEnv(rewards=[1.0, 0.0])))
    assert [t.ac.tokens.tolist() for t in traj.transitions] == [[7, 8], [7, 8]]


class _SlowCleanupBuilder(ScriptedGroupBuilder):
    """A builder whose `cleanup` takes `cleanup_s` seconds and records when it finished."""

    def __init__(self, *args: object, cleanup_s: float, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.cleanup_s = cleanup_s
        self.cleanup_finished = 0
        self.cleanup_started = asyncio.Event()

    async def cleanup(self) -> None:
        self.cleanup_started.set()
        await super().cleanup()
        await asyncio.sleep(self.cleanup_s)
        self.cleanup_finished += 1


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("cancels", [1, 3])
def test_a_slow_cleanup_finishes_when_the_rollout_is_cancelled(
    strategy: RolloutStrategy, cancels: int
) -> None:
    builder = _SlowCleanupBuilder(lambda i: ScriptedEnv(prompt=[i]), group_size=2, cleanup_s=0.1)

    async def main() -> None:
        task = asyncio.create_task(do_group_rollout(builder, POLICY, strategy=strategy))
        await builder.cleanup_started.wait()  # the rollout is done, cleanup is running
        for _ in range(cancels):
            task.cancel()
            await asyncio.sleep(0.01)
        await task

    with pytest.raises(asyncio.CancelledError):
        _run(main())
    assert builder.cleanup_calls == 1
    assert builder.cleanup_finished == 1


def test_cancellation_during_rollouts_still_runs_a_slow_cleanup_to_the_end() -> None:
    builder = _SlowCleanupBuilder(
        lambda i: ScriptedEnv(prompt=[i], hang_at_step=0), group_size=2, cleanup_s=0.05
    )

    async def main() -> None:
        task = asyncio.create_task(do_group_rollout(builder, POLICY))
        await asyncio.sleep(0.02)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        _run(main())
    assert (builder.cleanup_calls, builder.cleanup_finished) == (1, 1)
    assert all(e.cancelled for e in _created(builder))


def test_an_outer_timeout_around_a_group_still_works_with_the_shielded_cleanup() -> None:
    builder = _SlowCleanupBuilder(
        lambda i: ScriptedEnv(prompt=[i], hang_at_step=0), group_size=2, cleanup_s=0.05
    )

    async def main() -> None:
        async with asyncio.timeout(0.02):
            await do_group_rollout(builder, POLICY)

    with pytest.raises(TimeoutError):
        _run(main())
    assert builder.cleanup_finished == 1


@pytest.mark.parametrize(
    ("strategy", "skipped"),
    [(FailFast(), None), (RetryOnFailure(), True), (MinViableGroup(), True)],
    ids=["FailFast", "RetryOnFailure", "MinViableGroup"],
)
@pytest.mark.parametrize("where", ["make_envs", "compute_group_rewards"])
def test_group_level_runtime_errors_skip_the_group_under_tolerant_strategies(
    strategy: RolloutStrategy, skipped: bool | None, where: str
) -> None:
    error = RuntimeError("grader crashed")
    key = "rewards_error" if where == "compute_group_rewards" else "make_envs_error"
    builders = [_builder(2, **{key: error}), _builder(2)]  # type: ignore[arg-type]
    if skipped is None:
        with pytest.raises(RuntimeError, match="grader crashed"):
            _run(do_batch_rollouts(builders, POLICY, strategy=strategy))
    else:
        outcomes = _run(do_batch_rollouts(builders, POLICY, strategy=strategy))
        assert [type(o) for o in outcomes] == [Failure, Success]
        assert outcomes[0].failure().error_type == "RuntimeError"
    assert [b.cleanup_calls for b in builders] == [1, 1]


def test_min_viable_group_keeps_a_partial_group_on_a_key_error() -> None:
    # 4 envs, floor 3, no retries: env 3 raises a KeyError (the cookbook keeps 3 of 4)
    builder = _builder(4, failing=[3], error=lambda i: KeyError("missing field"))
    group = _run(do_group_rollout(builder, POLICY, strategy=MinViableGroup(max_retries=0)))
    assert len(group.trajectories_G) == 3
    assert [e.error_type for e in group.rollout_errors] == ["KeyError"]


def test_all_trajectories_failed_skips_the_group_even_under_fail_fast() -> None:
    builders = [
        _builder(2, failing=[0], error=lambda i: AllTrajectoriesFailedError("none")),
        _builder(2),
    ]
    outcomes = _run(do_batch_rollouts(builders, POLICY, strategy=FailFast()))
    assert [type(o) for o in outcomes] == [Failure, Success]
    assert issubclass(BelowMinViableGroupError, AllTrajectoriesFailedError)
    assert issubclass(AllTrajectoriesFailedError, GroupRolloutError)
    assert issubclass(AllTrajectoriesFailedError, RuntimeError)


def test_fail_fast_per_rollout_timeout_fails_the_group() -> None:
    builder = _builder(3, hanging=[1])
    with pytest.raises(TimeoutError, match=r"per_rollout_timeout of 0\.05 s"):
        _run(do_group_rollout(builder, POLICY, strategy=FailFast(per_rollout_timeout=0.05)))
    assert builder.cleanup_calls == 1 and builder.make_envs_calls == 1


def test_strategies_take_the_cookbook_constructor_arguments() -> None:
    assert RetryOnFailure() == RetryOnFailure(3, 0)
    assert RetryOnFailure(2, 1800).per_rollout_timeout == 1800
    assert MinViableGroup(6, 2, 30.0) == MinViableGroup(
        min_successful=6, max_retries=2, per_rollout_timeout=30.0
    )
    assert FailFast().per_rollout_timeout is None
    assert [s.catches_group_errors for s in (FailFast(), RetryOnFailure(), MinViableGroup())] == [
        False,
        True,
        True,
    ]
    with pytest.raises(TypeError):
        FailFast(5.0)  # type: ignore[misc]  # our extra option is keyword-only


def test_rollout_strategy_from_config_is_the_cookbook_mapping() -> None:
    assert rollout_strategy_from_config(False) == FailFast()
    assert rollout_strategy_from_config(True) == RetryOnFailure(max_retries=3)
    mine = MinViableGroup(min_successful=2)
    assert rollout_strategy_from_config(mine) is mine
    with pytest.raises(ConfigError, match="Invalid rollout_error_tolerance value: 1"):
        rollout_strategy_from_config(1)  # type: ignore[arg-type]


def test_default_rollout_strategy_for_model() -> None:
    assert default_rollout_strategy_for_model("thinkingmachines/Inkling-1") == MinViableGroup()
    assert default_rollout_strategy_for_model("thinkingmachines/Inkling:peft:131072") == (
        MinViableGroup()
    )
    assert default_rollout_strategy_for_model("Qwen/Qwen3-8B") == FailFast()


def test_rollout_error_counter_accumulates_across_batches() -> None:
    counter = RolloutErrorCounter()
    assert counter.get_metrics() == {}
    for _ in range(2):  # two steps, each: one recovered failure and one skipped group
        outcomes = _run(
            do_batch_rollouts(
                [_builder(2, failing=[0]), _builder(2, failing=[0, 1, 2])],
                POLICY,
                strategy=RetryOnFailure(max_retries=1),
            )
        )
        assert batch_rollout_error_metrics(outcomes) == {
            "rollout_errors/EnvFailure": 1.0,
            "rollout_errors/total": 1.0,
            "rollout_errors/groups_skipped": 1.0,
        }
        for outcome in outcomes:
            counter.ingest(outcome)
    assert counter.get_metrics() == {
        "rollout_errors/EnvFailure": 2.0,
        "rollout_errors/total": 2.0,
        "rollout_errors/groups_skipped": 2.0,
    }
    counter.ingest(None)  # the cookbook's form of a skipped group
    assert counter.get_metrics("errs")["errs/groups_skipped"] == 3.0


class _OrderStrategy(RolloutStrategy):
    """A custom strategy as cookbook users write them: runs env 0 only."""

    async def execute(self, env_group_builder, policy):  # type: ignore[no-untyped-def]
        envs = await env_group_builder.make_envs()
        trajectory = await do_single_rollout(policy, envs[0])
        return RolloutResult(trajectories=[trajectory], envs=[envs[0]], errors=[])


def test_a_custom_strategy_subclass_runs_through_do_group_rollout() -> None:
    builder = _builder(3, group_rewards=[2.0])
    group = _run(do_group_rollout(builder, POLICY, _OrderStrategy()))
    assert group.final_rewards_G == (2.0,)
    assert builder.cleanup_calls == 1


def test_filter_constant_reward_returns_none_for_constant_and_skipped_groups() -> None:
    client = FakeSamplingClient()

    def run(builder: ScriptedGroupBuilder, remove: bool, strategy: RolloutStrategy | None = None):
        return _run(
            do_group_rollout_and_filter_constant_reward(
                client, builder, 4, 1.0, remove, strategy=strategy
            )
        )

    assert run(_builder(2, group_rewards=[1.0]), True) is None  # constant: filtered
    kept = run(_builder(2, group_rewards=[1.0]), False)
    assert kept is not None and kept.get_total_rewards() == [1.5, 1.5]
    assert run(_builder(2, group_rewards=[1.0, 0.0]), True) is not None
    failing = _builder(2, failing=[0, 1, 2, 3, 4])
    assert run(failing, True, RetryOnFailure(max_retries=1)) is None  # skipped
    with pytest.raises(EnvFailure):
        run(_builder(2, failing=[0]), True, FailFast())
    assert all(len(call[0]) > 0 for call in client.sample_calls)


# --- termination reward policy ---------------------------------------------------------------


class _GradingBuilder(ScriptedGroupBuilder):
    def __init__(self, *args: object, grade_s: float = 0.0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.grade_s = grade_s
        self.grade_calls = 0

    async def compute_group_rewards(self, trajectories, envs):  # type: ignore[no-untyped-def]
        self.grade_calls += 1
        await asyncio.sleep(self.grade_s)
        return await super().compute_group_rewards(trajectories, envs)


def _stopping(reasons: Sequence[str | None], step_reward: float) -> Callable[[int], Env]:
    def make(i: int) -> Env:
        reason = reasons[i % len(reasons)]
        metrics = {} if reason is None else {f"stop/{reason}": 1.0}
        return ScriptedEnv(prompt=[i], rewards=[step_reward], metrics=metrics)

    return make


def test_zero_reward_on_limit_clamps_limit_stopped_totals_after_grading() -> None:
    builder = _GradingBuilder(
        _stopping(["max_turns", None, "max_tokens", "completed"], 0.5),
        group_size=4,
        group_rewards=[1.0, 1.0, -2.0, 1.0],
    )
    group = _run(
        do_group_rollout(
            builder, POLICY, termination=TerminationRewardPolicy(zero_reward_on_limit=True)
        )
    )
    assert builder.grade_calls == 1
    assert group.get_total_rewards() == [0.0, 1.5, -1.5, 1.5]
    assert group.final_rewards_G == (-0.5, 1.0, -2.0, 1.0)
    assert group.metrics_G[0] == {"group_reward": 1.0, "zero_reward_on_limit": 1.0}
    assert "zero_reward_on_limit" not in group.metrics_G[2]
    untouched = _run(
        do_group_rollout(
            _GradingBuilder(_stopping(["max_turns"], 0.5), group_size=2, group_rewards=[1.0]),
            POLICY,
            termination=TerminationRewardPolicy(),
        )
    )
    assert untouched.get_total_rewards() == [1.5, 1.5]


def test_grading_is_skipped_only_when_every_trajectory_timed_out() -> None:
    policy = TerminationRewardPolicy(zero_reward_on_limit=True, skip_grading_on_timeout=True)
    all_timed_out = _GradingBuilder(
        _stopping(["rollout_timeout"], 0.5), group_size=3, group_rewards=[1.0]
    )
    group = _run(do_group_rollout(all_timed_out, POLICY, termination=policy))
    assert all_timed_out.grade_calls == 0
    assert group.final_rewards_G == (-0.5, -0.5, -0.5)  # 0.0, then the clamp of the 0.5 steps
    assert group.get_total_rewards() == [0.0, 0.0, 0.0]
    mixed = _GradingBuilder(
        _stopping(["rollout_timeout", None], 0.5), group_size=2, group_rewards=[1.0]
    )
    group = _run(do_group_rollout(mixed, POLICY, termination=policy))
    assert mixed.grade_calls == 1
    assert group.get_total_rewards() == [0.0, 1.5]
    no_clamp = _GradingBuilder(
        _stopping(["rollout_timeout"], 0.5), group_size=2, group_rewards=[1.0]
    )
    _run(
        do_group_rollout(
            no_clamp, POLICY, termination=TerminationRewardPolicy(skip_grading_on_timeout=True)
        )
    )
    assert no_clamp.grade_calls == 1


def test_grader_timeout_is_a_group_error() -> None:
    policy = TerminationRewardPolicy(grader_timeout_seconds=0.05)
    slow = _GradingBuilder(_stopping([None], 0.5), group_size=2, grade_s=1.0)
    with pytest.raises(
        TimeoutError, match=r"compute_group_rewards exceeded grader_timeout_seconds=0\.05"
    ):
        _run(do_group_rollout(slow, POLICY, termination=policy))
    assert slow.cleanup_calls == 1
    slow = _GradingBuilder(_stopping([None], 0.5), group_size=2, grade_s=1.0)
    outcomes = _run(
        do_batch_rollouts([slow], POLICY, strategy=RetryOnFailure(), termination=policy)
    )
    assert outcomes[0].failure().error_type == "TimeoutError"


@pytest.mark.parametrize("part", ["_strategies", "_group", "_batch"])
def test_docstring_examples_of_the_parts_run(part: str) -> None:
    import doctest
    import importlib

    module = importlib.import_module(f"shell.rollouts.{part}")
    assert doctest.testmod(module).failed == 0


# --- the rollout executor --------------------------------------------------------------------


class _ThreadRecordingEnv(ScriptedEnv):
    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        import threading

        _THREADS.add(threading.get_ident())
        return await super().step(action, extra=extra)


_THREADS: set[int] = set()


def test_a_rollout_executor_runs_each_group_in_a_worker() -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from shell.rollouts import get_rollout_executor, set_rollout_executor

    def builders() -> list[ScriptedGroupBuilder]:
        return [
            ScriptedGroupBuilder(lambda i: _ThreadRecordingEnv(prompt=[i]), group_size=2),
            _builder(2, failing=[0, 1, 2]),  # skipped under RetryOnFailure(1)
            _builder(2, group_rewards=[1.0, 0.0]),
        ]

    in_process = _run(do_batch_rollouts(builders(), POLICY, strategy=RetryOnFailure(1)))
    _THREADS.clear()
    with ThreadPoolExecutor(max_workers=2) as pool:
        set_rollout_executor(pool)
        try:
            assert get_rollout_executor() is pool
            dispatched = _run(do_batch_rollouts(builders(), POLICY, strategy=RetryOnFailure(1)))
            filtered = _run(
                do_group_rollout_and_filter_constant_reward(
                    FakeSamplingClient(), _builder(2, group_rewards=[1.0]), 4, 1.0, True
                )
            )
            with pytest.raises(EnvFailure):  # FailFast errors cross the executor unchanged
                _run(do_batch_rollouts([_builder(2, failing=[0])], POLICY))
        finally:
            set_rollout_executor(None)
    assert get_rollout_executor() is None
    assert threading.get_ident() not in _THREADS and _THREADS
    assert [type(o) for o in dispatched] == [type(o) for o in in_process]
    assert [o.unwrap().get_total_rewards() for o in dispatched if isinstance(o, Success)] == [
        o.unwrap().get_total_rewards() for o in in_process if isinstance(o, Success)
    ]
    assert filtered is None  # constant reward, filtered in the worker


def test_a_fork_process_pool_is_refused_as_rollout_executor() -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from shell.rollouts import get_rollout_executor, set_rollout_executor

    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
    try:
        with pytest.raises(ValueError, match="starts its workers by 'fork'"):
            set_rollout_executor(pool)
        assert get_rollout_executor() is None
    finally:
        pool.shutdown()
