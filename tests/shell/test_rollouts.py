"""Tests for rollouts and failure strategies (`shell.rollouts`) with scripted fakes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from returns.result import Failure, Success

from shell.env import Env
from shell.errors import (
    BelowMinViableGroupError,
    EnvFailure,
    GroupRolloutError,
    RetryBudgetExhaustedError,
    RlpureError,
)
from shell.fakes import ScriptedEnv, ScriptedGroupBuilder, ScriptedPolicy
from shell.rollouts import (
    FailFast,
    GroupFailure,
    MinViableGroup,
    RetryOnFailure,
    RolloutStrategy,
    batch_rollout_error_metrics,
    do_batch_rollouts,
    do_group_rollout,
    do_single_rollout,
    min_viable_floor,
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
    builder = _builder(4, failing=[0, 1], hanging=[2, 3])
    with pytest.raises(RetryBudgetExhaustedError) as info:
        _run(do_group_rollout(builder, POLICY, strategy=RetryOnFailure(max_retries=1)))
    assert isinstance(info.value, GroupRolloutError) and isinstance(info.value, RuntimeError)
    assert [e.error_type for e in info.value.errors] == ["EnvFailure", "EnvFailure"]
    envs = _created(builder)
    assert envs[2].cancelled and envs[3].cancelled  # all-or-nothing: siblings cancelled
    assert builder.cleanup_calls == 1


def test_retry_on_failure_retries_a_timed_out_rollout() -> None:
    builder = _builder(2, hanging=[0])
    strategy = RetryOnFailure(max_retries=1, per_rollout_timeout=0.05)
    group = _run(do_group_rollout(builder, POLICY, strategy=strategy))
    assert [e.error_type for e in group.rollout_errors] == ["RolloutTimeoutError"]
    assert group.rollout_errors[0].error_message == "rollout exceeded its 0.05 s deadline"
    assert [t.transitions[0].ob.to_ints()[0] for t in group.trajectories_G] == [2, 1]
    assert _created(builder)[0].cancelled
    assert builder.cleanup_calls == 1


def test_retry_on_failure_times_out_all_or_nothing_when_no_budget_is_left() -> None:
    builder = _builder(3, hanging=[0, 1, 2])
    strategy = RetryOnFailure(max_retries=0, per_rollout_timeout=0.05)
    with pytest.raises(RetryBudgetExhaustedError) as info:
        _run(do_group_rollout(builder, POLICY, strategy=strategy))
    assert info.value.errors[0].error_type == "RolloutTimeoutError"
    assert builder.cleanup_calls == 1


def test_retry_on_failure_never_retries_programming_errors() -> None:
    builder = _builder(3, failing=[1], error=lambda i: AttributeError("typo"), hanging=[0, 2])
    with pytest.raises(AttributeError, match="typo"):
        _run(do_group_rollout(builder, POLICY, strategy=RetryOnFailure(max_retries=5)))
    assert builder.make_envs_calls == 1
    assert builder.cleanup_calls == 1
    assert _created(builder)[0].cancelled


def test_retry_on_failure_accepts_extra_failure_types() -> None:
    class SandboxCrash(Exception):
        pass

    builder = _builder(2, failing=[0], error=lambda i: SandboxCrash("crash"))
    strategy = RetryOnFailure(max_retries=1, failures=(SandboxCrash,))
    group = _run(do_group_rollout(builder, POLICY, strategy=strategy))
    assert [e.error_type for e in group.rollout_errors] == ["SandboxCrash"]


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
    except RetryBudgetExhaustedError as err:
        assert len(err.errors) == max_retries + 1
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
    ["success", "rollout_error", "make_envs_error", "rewards_error", "bug", "cancelled"],
)
def test_cleanup_is_called_exactly_once_in_every_path(strategy: RolloutStrategy, path: str) -> None:
    kwargs: dict[str, object] = {}
    if path == "rollout_error":
        kwargs["failing"] = list(range(20))
    elif path == "make_envs_error":
        kwargs["make_envs_error"] = OSError("no sandbox")
    elif path == "rewards_error":
        kwargs["rewards_error"] = EnvFailure("grader down")
    elif path == "bug":
        kwargs["failing"] = [0]
        kwargs["error"] = lambda i: KeyError("oops")
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
            "bug": KeyError,
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
    assert failure.error_type == "RetryBudgetExhaustedError"
    assert [e.error_type for e in failure.errors] == ["EnvFailure", "EnvFailure"]
    assert outcomes[2].failure().error_type == "ConnectionRefusedError" or (
        outcomes[2].failure().error_type == "ConnectionError"
    )
    assert batch_rollout_error_metrics(outcomes) == {
        "rollout_errors/ConnectionError": 1.0,
        "rollout_errors/EnvFailure": 3.0,
        "rollout_errors/total": 4.0,
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
        lambda: RetryOnFailure(per_rollout_timeout=0.0),
        lambda: MinViableGroup(min_successful=0),
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


# --- review findings: cleanup never masks the real error; only transient failures retry -------


def test_a_failing_cleanup_does_not_replace_the_error_that_is_propagating() -> None:
    builder = ScriptedGroupBuilder(
        lambda i: ScriptedEnv(fail_at_step=0, error=KeyError("the real bug")),
        group_size=2,
        cleanup_error=ConnectionResetError("cleanup boom"),
    )
    for strategy in (FailFast(), RetryOnFailure(max_retries=2)):
        with pytest.raises(KeyError, match="the real bug"):
            asyncio.run(do_group_rollout(builder, POLICY, strategy=strategy))


def test_a_failing_cleanup_after_success_is_raised() -> None:
    builder = ScriptedGroupBuilder(
        lambda i: ScriptedEnv(), group_size=2, cleanup_error=ConnectionResetError("boom")
    )
    with pytest.raises(ConnectionResetError, match="boom"):
        asyncio.run(do_group_rollout(builder, POLICY))
    assert builder.cleanup_calls == 1


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError("missing.json"),
        PermissionError("denied"),
    ],
)
def test_deterministic_outside_errors_are_not_retried(error: BaseException) -> None:
    builder = ScriptedGroupBuilder(lambda i: ScriptedEnv(fail_at_step=0, error=error), group_size=2)
    with pytest.raises(type(error)):
        asyncio.run(do_group_rollout(builder, POLICY, strategy=RetryOnFailure(max_retries=3)))
    assert builder.make_envs_calls == 1  # no retry


def test_sdk_client_errors_are_not_retried_but_transient_ones_are() -> None:
    import httpx
    import tinker

    request = httpx.Request("POST", "https://example.invalid/sample")
    bad = tinker.BadRequestError(
        "bad datum", response=httpx.Response(400, request=request), body=None
    )
    builder = ScriptedGroupBuilder(lambda i: ScriptedEnv(fail_at_step=0, error=bad), group_size=2)
    with pytest.raises(tinker.BadRequestError):
        asyncio.run(do_group_rollout(builder, POLICY, strategy=RetryOnFailure(max_retries=3)))
    assert builder.make_envs_calls == 1
    flaky = tinker.APIConnectionError(request=request)
    builder = ScriptedGroupBuilder(
        lambda i: ScriptedEnv(fail_at_step=0, error=flaky) if i == 0 else ScriptedEnv(),
        group_size=2,
    )
    group = asyncio.run(do_group_rollout(builder, POLICY, strategy=RetryOnFailure(max_retries=3)))
    assert len(group.trajectories_G) == 2
    assert [e.error_type for e in group.rollout_errors] == ["APIConnectionError"]
