"""Differential tests: rollout strategies and the group rollout, cookbook 0.6.1 vs `shell.rollouts`.

One scripted env/builder behaviour (`_Script`) is served to both sides through a thin adapter
per side (the cookbook's `rl.types` classes, ours from `shell.env`); each case runs through the
cookbook's `do_group_rollout` / `do_group_rollout_and_filter_constant_reward` and ours, and the
outcomes are compared: kept / skipped / raised, the exception type, `make_envs` and `cleanup`
calls, the sorted total rewards and the rollout error types. The cases where we differ on
purpose are pinned as such (`test_deliberate_*`), with the cookbook's behaviour behind an
option where one exists.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest
import tinker

pytest.importorskip("tinker_cookbook")

from tinker_cookbook import completers as cb_completers
from tinker_cookbook import exceptions as cb_exceptions
from tinker_cookbook.rl import rollout_limits as cb_limits
from tinker_cookbook.rl import rollout_strategy as cb_strategy
from tinker_cookbook.rl import rollouts as cb_rollouts
from tinker_cookbook.rl import types as cb_types

from rlpure.records import StepResult
from shell import rollouts
from shell.env import Env, EnvGroupBuilder
from shell.errors import ConfigError
from shell.fakes import ScriptedPolicy
from shell.fakes._sdk import FakeSamplingClient

Side = str  # "cookbook" or "ours"


def _error(name: str, side: Side, message: str) -> Exception:
    """An exception of the kind `name` as each side's env code would raise it."""
    if name == "ConfigurationError":
        return (
            cb_exceptions.ConfigurationError(message)
            if side == "cookbook"
            else ConfigError(message)
        )
    if name == "CookbookConfigurationError":  # the cookbook's own class, on both sides
        return cb_exceptions.ConfigurationError(message)
    if name == "AllTrajectoriesFailedError":
        if side == "cookbook":
            return cb_exceptions.AllTrajectoriesFailedError(message)
        from shell.errors import AllTrajectoriesFailedError

        return AllTrajectoriesFailedError(message)
    kind = getattr(builtins, name)
    return kind(message)  # type: ignore[no-any-return]


@dataclass
class _Script:
    """What a group does, by env creation index (0, 1, ... across `make_envs` calls)."""

    group_size: int = 3
    fail_initial: dict[int, str] = field(default_factory=dict)
    fail_step: dict[int, str] = field(default_factory=dict)
    hang_step: set[int] = field(default_factory=set)
    step_latency: dict[int, float] = field(default_factory=dict)
    stop_reason: dict[int, str] = field(default_factory=dict)
    fail_make_envs: dict[int, str] = field(default_factory=dict)  # by make_envs call index
    fail_rewards: str | None = None
    group_reward: Callable[[int], float] = lambda index: 0.0  # by env creation index
    grade_s: float = 0.0
    cleanup_s: float = 0.0
    # counters
    make_envs_calls: int = 0
    cleanup_calls: int = 0
    cleanup_finished: int = 0
    grade_calls: int = 0
    steps_done: list[int] = field(default_factory=list)
    created: int = 0
    cleanup_started: asyncio.Event | None = None


class _Core:
    """The env behaviour both adapters delegate to (one step per episode)."""

    def __init__(self, script: _Script, index: int, side: Side) -> None:
        self.script, self.index, self.side = script, index, side

    async def initial(self) -> list[int]:
        if self.index in self.script.fail_initial:
            raise _error(self.script.fail_initial[self.index], self.side, f"initial {self.index}")
        return [self.index, 1]

    async def step(self, action: Sequence[int]) -> tuple[float, dict[str, float]]:
        assert type(action) is list and action, f"{self.side}: action {action!r}"
        await asyncio.sleep(self.script.step_latency.get(self.index, 0.0))
        if self.index in self.script.hang_step:
            await asyncio.Event().wait()
        if self.index in self.script.fail_step:
            raise _error(self.script.fail_step[self.index], self.side, f"step {self.index}")
        self.script.steps_done.append(self.index)
        reason = self.script.stop_reason.get(self.index)
        metrics = {} if reason is None else {f"stop/{reason}": 1.0}
        return float(self.index % 7) / 4, metrics


async def _make_cores(script: _Script, side: Side) -> list[_Core]:
    call = script.make_envs_calls
    script.make_envs_calls += 1
    if call in script.fail_make_envs:
        raise _error(script.fail_make_envs[call], side, f"make_envs {call}")
    cores = [_Core(script, script.created + g, side) for g in range(script.group_size)]
    script.created += script.group_size
    return cores


async def _group_rewards(
    script: _Script, side: Side, indices: Sequence[int]
) -> list[tuple[float, dict[str, float]]]:
    script.grade_calls += 1
    await asyncio.sleep(script.grade_s)
    if script.fail_rewards is not None:
        raise _error(script.fail_rewards, side, "grader")
    return [(script.group_reward(i), {"graded": 1.0}) for i in indices]


async def _cleanup(script: _Script) -> None:
    script.cleanup_calls += 1
    if script.cleanup_started is not None:
        script.cleanup_started.set()
    await asyncio.sleep(script.cleanup_s)
    script.cleanup_finished += 1


# --- the cookbook's side ---------------------------------------------------------------------


class _CbEnv(cb_types.Env):  # type: ignore[misc]  # untyped without the cookbook
    def __init__(self, core: _Core) -> None:
        self.core = core

    async def initial_observation(self) -> Any:
        return tinker.ModelInput.from_ints(await self.core.initial()), [0]

    async def step(self, action: Any, *, extra: Any = None) -> cb_types.StepResult:
        reward, metrics = await self.core.step(action)
        return cb_types.StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker.ModelInput.from_ints([]),
            next_stop_condition=[0],
            metrics=metrics,
        )


class _CbBuilder(cb_types.EnvGroupBuilder):  # type: ignore[misc]
    def __init__(self, script: _Script) -> None:
        self.script = script

    async def make_envs(self) -> Sequence[cb_types.Env]:
        return [_CbEnv(core) for core in await _make_cores(self.script, "cookbook")]

    async def compute_group_rewards(self, trajectory_group: Any, env_group: Any) -> Any:
        indices = [env.core.index for env in env_group]
        return await _group_rewards(self.script, "cookbook", indices)

    async def cleanup(self) -> None:
        await _cleanup(self.script)

    def logging_tags(self) -> list[str]:
        return ["parity"]


class _CbPolicy(cb_completers.TokenCompleter):  # type: ignore[misc]
    async def __call__(self, model_input: Any, stop: Any, *, max_tokens: int | None = None) -> Any:
        return cb_completers.TokensWithLogprobs(tokens=[7, 8], maybe_logprobs=[-1.0, -1.0])


# --- our side --------------------------------------------------------------------------------


class _OurEnv(Env):
    def __init__(self, core: _Core) -> None:
        self.core = core

    async def initial_observation(self) -> Any:
        return tinker.ModelInput.from_ints(await self.core.initial()), (0,)

    async def step(self, action: Any, *, extra: Any = None) -> StepResult:
        reward, metrics = await self.core.step(action)
        return StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker.ModelInput.from_ints([]),
            next_stop_condition=(0,),
            metrics=metrics,
        )


class _OurBuilder(EnvGroupBuilder):
    def __init__(self, script: _Script) -> None:
        self.script = script

    async def make_envs(self) -> Sequence[Env]:
        return [_OurEnv(core) for core in await _make_cores(self.script, "ours")]

    async def compute_group_rewards(self, trajectories: Any, envs: Any) -> Any:
        return await _group_rewards(self.script, "ours", [env.core.index for env in envs])

    async def cleanup(self) -> None:
        await _cleanup(self.script)

    def logging_tags(self) -> list[str]:
        return ["parity"]


# --- running a case on both sides ------------------------------------------------------------

StrategySpec = tuple[str, dict[str, Any]]


def _strategy(spec: StrategySpec, side: Side, ours_extra: dict[str, Any]) -> Any:
    name, kwargs = spec
    module: Any = cb_strategy if side == "cookbook" else rollouts
    kind = {"fail_fast": "FailFast", "retry": "RetryOnFailure", "min_viable": "MinViableGroup"}
    extra = ours_extra if side == "ours" else {}
    return getattr(module, kind[name])(**kwargs, **extra)


# Same exception, two names: ours is the more specific subclass (below the floor), or our class
# that `shell.cookbook.exceptions.ConfigurationError` names (one class, so its error type reads
# "ConfigError" in `rollout_errors`).
_SAME_KIND = {
    "BelowMinViableGroupError": "AllTrajectoriesFailedError",
    "ConfigError": "ConfigurationError",
}


@dataclass(frozen=True)
class _Side:
    """One side's entry points: its rollouts module, builder adapter and scripted policy."""

    name: Side

    @property
    def module(self) -> Any:
        return cb_rollouts if self.name == "cookbook" else rollouts

    def builder(self, script: _Script) -> Any:
        return _CbBuilder(script) if self.name == "cookbook" else _OurBuilder(script)

    def policy(self) -> Any:
        return _CbPolicy() if self.name == "cookbook" else ScriptedPolicy(actions=[[7, 8]])

    def strategy(self, spec: StrategySpec, **ours_extra: Any) -> Any:
        return _strategy(spec, self.name, ours_extra)

    def termination(self, kwargs: dict[str, Any]) -> Any:
        """Each side's own `TerminationRewardPolicy` with the same fields."""
        module: Any = cb_limits if self.name == "cookbook" else rollouts
        return module.TerminationRewardPolicy(**kwargs)


SIDES = (_Side("cookbook"), _Side("ours"))


@dataclass(frozen=True)
class _Outcome:
    kind: str  # kept / skipped / raised
    exception: str | None
    make_envs_calls: int
    cleanup_calls: int
    total_rewards: tuple[float, ...]
    error_types: tuple[str, ...]


async def _outcome(run: Callable[[], Any], script: _Script) -> _Outcome:
    group = None
    try:
        group = await run()
    except Exception as exc:  # the outcome of interest: which exception
        name = type(exc).__name__
        return _Outcome(
            "raised",
            _SAME_KIND.get(name, name),
            script.make_envs_calls,
            script.cleanup_calls,
            (),
            (),
        )
    if group is None:
        return _Outcome("skipped", None, script.make_envs_calls, script.cleanup_calls, (), ())
    return _Outcome(
        "kept",
        None,
        script.make_envs_calls,
        script.cleanup_calls,
        tuple(sorted(group.get_total_rewards())),
        tuple(sorted(_SAME_KIND.get(e.error_type, e.error_type) for e in group.rollout_errors)),
    )


def _both(
    make_script: Callable[[], _Script],
    spec: StrategySpec,
    *,
    level: str,
    termination_kwargs: dict[str, Any] | None = None,
    ours_extra: dict[str, Any] | None = None,
) -> tuple[_Outcome, _Outcome, _Script, _Script]:
    """Runs the case on both sides; returns (cookbook, ours) outcomes and their scripts."""
    results = []
    for side in SIDES:
        script = make_script()
        strategy = side.strategy(spec, **(ours_extra or {}))
        termination = None if termination_kwargs is None else side.termination(termination_kwargs)
        run: Callable[[], Any]
        if level == "group":
            run = partial(
                side.module.do_group_rollout,
                side.builder(script),
                side.policy(),
                strategy=strategy,
                termination=termination,
            )
        else:
            run = partial(
                side.module.do_group_rollout_and_filter_constant_reward,
                FakeSamplingClient(),
                side.builder(script),
                8,
                1.0,
                False,
                strategy=strategy,
                termination=termination,
            )
        results.append((asyncio.run(_outcome(run, script)), script))
    (cb, cb_script), (ours, our_script) = results
    return cb, ours, cb_script, our_script


FAIL_FAST: StrategySpec = ("fail_fast", {})
RETRY_1: StrategySpec = ("retry", {"max_retries": 1})
MIN_VIABLE_0: StrategySpec = ("min_viable", {"max_retries": 0})
MIN_VIABLE_2: StrategySpec = ("min_viable", {"max_retries": 2})

# (case id, script factory, strategy, expected kind at the group level, at the filter level)
CASES: list[tuple[str, Callable[[], _Script], StrategySpec, str, str]] = [
    ("success", lambda: _Script(), FAIL_FAST, "kept", "kept"),
    ("success_retry", lambda: _Script(), RETRY_1, "kept", "kept"),
    (
        "initial_observation_fails_fail_fast",
        lambda: _Script(fail_initial={1: "RuntimeError"}),
        FAIL_FAST,
        "raised",
        "raised",
    ),
    (
        "initial_observation_fails_retried",
        lambda: _Script(fail_initial={1: "RuntimeError"}),
        RETRY_1,
        "kept",
        "kept",
    ),
    (
        "step_fails_fail_fast",
        lambda: _Script(fail_step={0: "RuntimeError"}),
        FAIL_FAST,
        "raised",
        "raised",
    ),
    (
        "step_runtime_error_retried",
        lambda: _Script(fail_step={0: "RuntimeError"}),
        RETRY_1,
        "kept",
        "kept",
    ),
    (
        "step_value_error_retried",
        lambda: _Script(fail_step={2: "ValueError"}),
        RETRY_1,
        "kept",
        "kept",
    ),
    (
        "retries_exhausted",
        lambda: _Script(fail_step={0: "RuntimeError", 3: "OSError"}),
        RETRY_1,
        "raised",
        "skipped",
    ),
    (
        "make_envs_fails_fail_fast",
        lambda: _Script(fail_make_envs={0: "RuntimeError"}),
        FAIL_FAST,
        "raised",
        "raised",
    ),
    (
        "make_envs_fails_retry",
        lambda: _Script(fail_make_envs={0: "RuntimeError"}),
        RETRY_1,
        "raised",
        "skipped",
    ),
    (
        "make_envs_fails_on_retry",
        lambda: _Script(fail_step={1: "RuntimeError"}, fail_make_envs={1: "ConnectionError"}),
        RETRY_1,
        "raised",
        "skipped",
    ),
    (
        "rewards_fail_fail_fast",
        lambda: _Script(fail_rewards="RuntimeError"),
        FAIL_FAST,
        "raised",
        "raised",
    ),
    (
        "rewards_fail_retry",
        lambda: _Script(fail_rewards="RuntimeError"),
        RETRY_1,
        "raised",
        "skipped",
    ),
    (
        "rewards_fail_min_viable",
        lambda: _Script(fail_rewards="RuntimeError"),
        MIN_VIABLE_2,
        "raised",
        "skipped",
    ),
    (
        "min_viable_key_error_partial",
        lambda: _Script(group_size=4, fail_step={3: "KeyError"}),
        MIN_VIABLE_0,
        "kept",
        "kept",
    ),
    (
        "min_viable_retries_below_floor",
        lambda: _Script(group_size=4, fail_step={0: "RuntimeError", 1: "RuntimeError"}),
        MIN_VIABLE_2,
        "kept",
        "kept",
    ),
    (
        "min_viable_below_floor",
        lambda: _Script(group_size=4, fail_step={0: "KeyError", 1: "KeyError"}),
        MIN_VIABLE_0,
        "raised",
        "skipped",
    ),
    (
        "all_failed_error_fail_fast",
        lambda: _Script(fail_step={0: "AllTrajectoriesFailedError"}),
        FAIL_FAST,
        "raised",
        "skipped",
    ),
    (
        "timeout_retried",
        lambda: _Script(hang_step={1}),
        ("retry", {"max_retries": 1, "per_rollout_timeout": 0.05}),
        "kept",
        "kept",
    ),
    (
        "timeout_exhausted",
        lambda: _Script(hang_step={0, 3}),
        ("retry", {"max_retries": 1, "per_rollout_timeout": 0.05}),
        "raised",
        "skipped",
    ),
    (
        "timeout_min_viable",
        lambda: _Script(group_size=4, hang_step={2}),
        ("min_viable", {"max_retries": 0, "per_rollout_timeout": 0.05}),
        "kept",
        "kept",
    ),
]


@pytest.mark.parametrize("level", ["group", "filter"])
@pytest.mark.parametrize(
    ("case", "make_script", "spec", "group_kind", "filter_kind"), CASES, ids=[c[0] for c in CASES]
)
def test_group_rollout_outcomes_agree(
    case: str,
    make_script: Callable[[], _Script],
    spec: StrategySpec,
    group_kind: str,
    filter_kind: str,
    level: str,
) -> None:
    cb, ours, cb_script, our_script = _both(make_script, spec, level=level)
    assert cb == ours
    assert cb.kind == (group_kind if level == "group" else filter_kind)
    assert cb_script.cleanup_finished == our_script.cleanup_finished == 1


def test_constant_reward_filtering_agrees() -> None:
    for group_reward, expected in (
        (lambda i: 1.0 - (i % 7) / 4, "skipped"),
        (lambda i: 0.0, "kept"),
    ):
        outcomes = []
        for side in SIDES:
            script = _Script(group_reward=group_reward)  # total = step reward + group reward
            run = partial(
                side.module.do_group_rollout_and_filter_constant_reward,
                FakeSamplingClient(),
                side.builder(script),
                8,
                1.0,
                True,
            )
            outcomes.append(asyncio.run(_outcome(run, script)))
        assert outcomes[0] == outcomes[1]
        assert outcomes[0].kind == expected


async def _cancel_group(
    side: _Side, spec: StrategySpec, script: _Script, *, during: str, cancels: int
) -> str:
    script.cleanup_started = asyncio.Event()
    task = asyncio.create_task(
        side.module.do_group_rollout(
            side.builder(script), side.policy(), strategy=side.strategy(spec)
        )
    )
    if during == "cleanup":
        await script.cleanup_started.wait()
    else:
        await asyncio.sleep(0.03)
    for _ in range(cancels):
        task.cancel()
        await asyncio.sleep(0.01)
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"
    return "returned"


@pytest.mark.parametrize("spec", [FAIL_FAST, RETRY_1, MIN_VIABLE_2], ids=lambda s: s[0])
@pytest.mark.parametrize("during", ["cleanup", "rollouts"])
@pytest.mark.parametrize("cancels", [1, 3])
def test_cancellation_lets_a_slow_cleanup_finish_on_both_sides(
    spec: StrategySpec, during: str, cancels: int
) -> None:
    seen = []
    for side in SIDES:
        script = _Script(cleanup_s=0.1, hang_step={0, 1, 2} if during == "rollouts" else set())
        result = asyncio.run(_cancel_group(side, spec, script, during=during, cancels=cancels))
        seen.append((result, script.cleanup_calls, script.cleanup_finished))
    assert seen[0] == seen[1] == ("cancelled", 1, 1)


def _error_batch() -> list[_Script]:
    return [
        _Script(fail_step={0: "RuntimeError"}),  # recovered: 1 error
        _Script(fail_step={0: "RuntimeError", 3: "KeyError"}),  # exhausted: skipped
        _Script(fail_rewards="ValueError"),  # group error: skipped
        _Script(hang_step={1}),  # timed out once: 1 TimeoutError
    ]


async def _error_step(side: _Side, strategy: Any) -> list[Any]:
    return await asyncio.gather(
        *(
            side.module.do_group_rollout_and_filter_constant_reward(
                FakeSamplingClient(), side.builder(script), 8, 1.0, False, strategy=strategy
            )
            for script in _error_batch()
        )
    )


def test_rollout_error_counts_agree_and_accumulate_across_steps() -> None:
    metrics = []
    for side in SIDES:
        counter = side.module.RolloutErrorCounter()
        strategy = side.strategy(("retry", {"max_retries": 1, "per_rollout_timeout": 0.05}))
        per_step = []
        for _ in range(2):
            for result in asyncio.run(_error_step(side, strategy)):
                counter.ingest(result)
            per_step.append(counter.get_metrics())
        metrics.append(per_step)
    assert metrics[0] == metrics[1]
    assert metrics[0][1] == {
        "rollout_errors/RuntimeError": 2.0,
        "rollout_errors/TimeoutError": 2.0,
        "rollout_errors/total": 4.0,
        "rollout_errors/groups_skipped": 4.0,
    }


# --- termination reward policy ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "make_script", "policy"),
    [
        (
            "clamp",
            lambda: _Script(
                group_size=4,
                stop_reason={0: "max_turns", 1: "max_tokens", 2: "completed"},
                group_reward=lambda g: [1.0, -2.0, 1.0, 0.5][g],
            ),
            {"zero_reward_on_limit": True},
        ),
        (
            "no_clamp_without_the_flag",
            lambda: _Script(stop_reason={0: "max_turns"}, group_reward=lambda g: 1.0),
            {},
        ),
        (
            "skip_grading_all_timed_out",
            lambda: _Script(
                stop_reason={0: "rollout_timeout", 1: "rollout_timeout", 2: "rollout_timeout"},
                group_reward=lambda g: 1.0,
            ),
            {"zero_reward_on_limit": True, "skip_grading_on_timeout": True},
        ),
        (
            "grade_when_one_did_not_time_out",
            lambda: _Script(
                stop_reason={0: "rollout_timeout", 1: "rollout_timeout"}, group_reward=lambda g: 1.0
            ),
            {"zero_reward_on_limit": True, "skip_grading_on_timeout": True},
        ),
        (
            "grader_timeout_fail_fast",
            lambda: _Script(grade_s=1.0),
            {"grader_timeout_seconds": 0.05},
        ),
    ],
    ids=lambda c: c if isinstance(c, str) else "",
)
@pytest.mark.parametrize("spec", [FAIL_FAST, RETRY_1], ids=lambda s: s[0])
def test_termination_reward_policy_agrees(
    case: str, make_script: Callable[[], _Script], policy: dict[str, Any], spec: StrategySpec
) -> None:
    for level in ("group", "filter"):
        cb, ours, cb_script, our_script = _both(
            make_script, spec, level=level, termination_kwargs=policy
        )
        assert cb == ours
        assert cb_script.grade_calls == our_script.grade_calls
        if case == "clamp":
            # steps 0, .25, .5, .75; limit-stopped 0 (+1 → 0), 1 (.25-2 stays), 2 not a limit
            assert cb.total_rewards == tuple(sorted([0.0, -1.75, 1.5, 1.25]))
        if case == "skip_grading_all_timed_out":
            assert (cb_script.grade_calls, cb.total_rewards) == (0, (0.0, 0.0, 0.0))
        if case == "grader_timeout_fail_fast":
            assert cb.kind == ("raised" if level == "group" or spec == FAIL_FAST else "skipped")
            assert cb.kind != "raised" or cb.exception == "TimeoutError"


# --- deliberate differences ------------------------------------------------------------------


@pytest.mark.parametrize("spec", [RETRY_1, MIN_VIABLE_2], ids=lambda s: s[0])
def test_deliberate_config_errors_propagate_unless_fatal_is_emptied(spec: StrategySpec) -> None:
    def make() -> _Script:
        return _Script(fail_step={0: "ConfigurationError"})

    for level in ("group", "filter"):
        cb, ours, _, our_script = _both(make, spec, level=level)
        assert cb.kind == "kept" and cb.error_types == ("ConfigurationError",)
        # ours: a configuration error is not a rollout failure (retrying repeats it)
        assert (ours.kind, ours.exception) == ("raised", "ConfigurationError")
        assert our_script.make_envs_calls == 1
        # `fatal=()` is the cookbook's behaviour
        cb, ours, _, _ = _both(make, spec, level=level, ours_extra={"fatal": ()})
        assert cb == ours


@pytest.mark.parametrize("spec", [RETRY_1, MIN_VIABLE_2], ids=lambda s: s[0])
def test_deliberate_the_cookbooks_own_configuration_error_is_fatal_too(spec: StrategySpec) -> None:
    """A ported env calling a cookbook module (its renderers) may raise the cookbook's class."""

    def make() -> _Script:
        return _Script(fail_step={0: "CookbookConfigurationError"})

    cb, ours, _, our_script = _both(make, spec, level="group")
    assert cb.kind == "kept" and cb.error_types == ("ConfigurationError",)
    assert (ours.kind, ours.exception) == ("raised", "ConfigurationError")
    assert our_script.make_envs_calls == 1
    cb, ours, _, _ = _both(make, spec, level="group", ours_extra={"fatal": ()})
    assert cb == ours


async def _fail_then_wait(side: _Side, script: _Script) -> None:
    with pytest.raises(RuntimeError):
        await side.module.do_group_rollout(side.builder(script), side.policy())
    await asyncio.sleep(0.2)  # time for orphaned rollouts to finish


def test_deliberate_fail_fast_cancels_the_siblings_of_a_failed_rollout() -> None:
    """The cookbook's `asyncio.gather` leaves siblings running after `cleanup()`; ours cancels."""
    finished_after_failure = []
    for side in SIDES:
        script = _Script(fail_step={1: "RuntimeError"}, step_latency={0: 0.1, 2: 0.1})
        asyncio.run(_fail_then_wait(side, script))
        assert script.cleanup_calls == 1
        finished_after_failure.append(sorted(script.steps_done))
    assert finished_after_failure == [[0, 2], []]


def test_deliberate_trajectories_keep_slot_order_under_retries() -> None:
    """The cookbook keeps completion order (varies with timing); ours keeps `make_envs` order."""
    orders = []
    for side in SIDES:
        script = _Script(step_latency={0: 0.1, 1: 0.05})
        group = asyncio.run(
            side.module.do_group_rollout(
                side.builder(script), side.policy(), strategy=side.strategy(RETRY_1)
            )
        )
        orders.append(group.get_total_rewards())
    assert orders == [[0.5, 0.25, 0.0], [0.0, 0.25, 0.5]]


@pytest.mark.parametrize(
    ("case", "make_script", "spec", "group_kind", "filter_kind"),
    [
        c
        for c in CASES
        if c[0]
        in {"success", "retries_exhausted", "rewards_fail_retry", "min_viable_key_error_partial"}
    ],
    ids=lambda c: c if isinstance(c, str) else "",
)
def test_a_rollout_executor_gives_the_same_outcomes(
    case: str,
    make_script: Callable[[], _Script],
    spec: StrategySpec,
    group_kind: str,
    filter_kind: str,
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        cb_rollouts.set_rollout_executor(pool)
        rollouts.set_rollout_executor(pool)
        try:
            cb, ours, _, _ = _both(make_script, spec, level="filter")
        finally:
            cb_rollouts.set_rollout_executor(None)
            rollouts.set_rollout_executor(None)
    assert cb == ours
    assert cb.kind == filter_kind
