"""Differential tests against tinker-cookbook 0.6.1: records, `ProblemEnv` and the dataset
wrappers (`rl/types.py`, `rl/problem_env.py`, `rl/dataset_utils.py`, `rl/interleaved.py`).

- Records built from what the cookbook's own env code returns (its `StepResult` fields, its
  completer's `TokensWithLogprobs`) hold the same tokens, rewards and metrics.
- `ProblemEnv` with the cookbook's `role_colon` renderer gives bit-equal rewards and metrics
  and the same prompt, stop condition and next observation as the cookbook's `ProblemEnv`, for
  an `ArithmeticEnv`-like subclass and for the cookbook's `ArithmeticEnv` ported by the port
  rule; with rlpure's own `role_colon` renderer too.
- `cycle_permutation`, `epoch_batch_index`, `EpochCycledRLDataset` and the interleaved
  dataset give the cookbook's index sequences for several seeds and sizes, and refuse the same
  bad input with the same exception types.

The tokenizer is the local byte tokenizer (`rlpure.model.ByteTokenizer`), which both
renderers accept. Skipped without the cookbook (`make parity` runs them).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.parity.porting import ported_module

pytest.importorskip("tinker_cookbook", reason="needs tinker-cookbook 0.6.1 (make parity)")

import tinker
from tinker_cookbook import renderers as cb_renderers
from tinker_cookbook.completers import TokensWithLogprobs as CbTokensWithLogprobs
from tinker_cookbook.rl import dataset_utils as cb_dataset_utils
from tinker_cookbook.rl import interleaved as cb_interleaved
from tinker_cookbook.rl import problem_env as cb_problem_env
from tinker_cookbook.rl import types as cb_types

from rlpure import records
from rlpure.model import ByteTokenizer
from rlpure.render import get_renderer
from shell import datasets, env
from shell.cookbook import renderers as shell_renderers

TOKENIZER = ByteTokenizer()
EOS = TOKENIZER.eos_token_id
CB_RENDERER = cb_renderers.get_renderer("role_colon", TOKENIZER)
OUR_RENDERER = get_renderer("role_colon", TOKENIZER)
SHELL_RENDERER = shell_renderers.get_renderer("role_colon", TOKENIZER)
PREFIX = [
    {"role": "user", "content": "What is 4 + 5?"},
    {"role": "assistant", "content": "9"},
]


# --- records -----------------------------------------------------------------------------------


def test_stop_reason_and_rl_types_constants_match_the_cookbook() -> None:
    assert {r.name: r.value for r in records.StopReason} == {
        r.name: r.value for r in cb_types.StopReason
    }
    assert records.STOP_METRIC_PREFIX == cb_types.STOP_METRIC_PREFIX
    assert records.PARSE_ERROR_MASKED_METRIC_KEY == cb_types.PARSE_ERROR_MASKED_METRIC_KEY
    assert env.Action == cb_types.Action
    assert env.Logprobs == cb_types.Logprobs
    theirs = tuple(f.name for f in dataclasses.fields(cb_types.InitialObservationOverflow))
    assert records.InitialObservationOverflow.__struct_fields__ == theirs


def test_records_built_from_the_cookbook_step_result_fields_hold_the_same_values() -> None:
    cb_step = cb_types.StepResult(
        reward=0.5,
        episode_done=False,
        next_observation=tinker.ModelInput.from_ints([256, 10, 20]),
        next_stop_condition=["\n\nUser:"],
        metrics={"format": True, "n": 2},
        logs={"valid": False, "text": "x"},
    )
    ours = records.StepResult(**vars(cb_step))
    assert ours.next_observation.to_ints() == cb_step.next_observation.to_ints()
    assert list(ours.next_stop_condition) == cb_step.next_stop_condition
    assert ours.reward == cb_step.reward and ours.episode_done == cb_step.episode_done
    # bools are stored as the number the cookbook's averaging reads
    assert ours.metrics == {
        k: float(v) if isinstance(v, bool) else v for k, v in cb_step.metrics.items()
    }


def test_a_transition_built_from_the_cookbook_completer_output_keeps_every_field() -> None:
    sampled = CbTokensWithLogprobs(
        tokens=[5, 6, 7], maybe_logprobs=[-0.5, -1.25, -2.0], stop_reason="length", sequence_id="q"
    )
    cb_transition = cb_types.Transition(
        ob=tinker.ModelInput.from_ints([1, 2]), ac=sampled, reward=1.0, episode_done=True
    )
    ours = records.Transition(**vars(cb_transition))
    assert ours.ob.to_ints() == cb_transition.ob.to_ints()
    assert ours.ac.tokens.tolist() == sampled.tokens
    assert ours.ac.logprobs is not None and ours.ac.logprobs.tolist() == sampled.logprobs
    assert (ours.ac.stop_reason, ours.ac.sequence_id) == ("length", "q")
    trajectory = records.Trajectory(transitions=[ours], final_ob=tinker.ModelInput.empty())
    cb_trajectory = cb_types.Trajectory(
        transitions=[cb_transition], final_ob=tinker.ModelInput.empty()
    )
    group = records.TrajectoryGroup(
        trajectories_G=[trajectory], final_rewards_G=[0.25], metrics_G=[{}]
    )
    cb_group = cb_types.TrajectoryGroup([cb_trajectory], [0.25], [{}])
    assert group.get_total_rewards() == cb_group.get_total_rewards()


def test_tokens_with_logprobs_is_built_with_the_cookbook_keywords() -> None:
    kwargs: dict[str, Any] = {
        "tokens": [3, 1],
        "maybe_logprobs": [-0.5, -0.75],
        "stop_reason": "length",
        "sequence_id": "s",
        "prompt_cache_hit_tokens": 4,
    }
    ours, theirs = records.TokensWithLogprobs(**kwargs), CbTokensWithLogprobs(**kwargs)
    assert ours.tokens.tolist() == theirs.tokens
    assert ours.maybe_logprobs is not None
    assert ours.maybe_logprobs.tolist() == theirs.maybe_logprobs
    assert (ours.stop_reason, ours.sequence_id, ours.prompt_cache_hit_tokens) == (
        theirs.stop_reason,
        theirs.sequence_id,
        theirs.prompt_cache_hit_tokens,
    )
    assert records.as_tokens_with_logprobs(theirs) == ours
    assert [f.name for f in dataclasses.fields(CbTokensWithLogprobs)] == [
        "maybe_logprobs" if f == "logprobs" else f
        for f in records.TokensWithLogprobs.__struct_fields__
    ]


# --- ProblemEnv --------------------------------------------------------------------------------


class _Sum:
    """Shared answer logic of the two subclasses (the cookbook's ArithmeticEnv's, with a
    format check that can fail so both format branches are exercised)."""

    x = 3
    y = 4

    def get_question(self) -> str:
        return f"What is {self.x} + {self.y}?"

    def check_answer(self, sample_str: str) -> bool:
        return sample_str.strip().endswith(str(self.x + self.y))

    def check_format(self, sample_str: str) -> bool:
        return sample_str.strip().lstrip("-").isdigit()

    def get_reference_answer(self) -> str:
        return str(self.x + self.y)


class CookbookSumEnv(_Sum, cb_problem_env.ProblemEnv):  # type: ignore[misc]
    pass


class OurSumEnv(_Sum, env.ProblemEnv):
    pass


def _cookbook_step(action: list[int], strict: bool, coef: float) -> Any:
    cb_env = CookbookSumEnv(CB_RENDERER, PREFIX, coef, strict)
    return asyncio.run(cb_env.step(action))


def _assert_same_step(ours: records.StepResult, theirs: Any) -> None:
    assert type(ours.reward) is type(theirs.reward) is float
    assert ours.reward == theirs.reward  # bit-equal, not approx
    assert ours.metrics == theirs.metrics
    assert [type(v) for v in ours.metrics.values()] == [type(v) for v in theirs.metrics.values()]
    assert ours.logs == theirs.logs
    assert ours.episode_done == theirs.episode_done
    assert ours.next_observation.to_ints() == theirs.next_observation.to_ints()
    assert list(ours.next_stop_condition) == list(theirs.next_stop_condition)


def test_problem_env_prompt_and_stop_condition_match_the_cookbook() -> None:
    theirs_ob, theirs_stop = asyncio.run(CookbookSumEnv(CB_RENDERER, PREFIX).initial_observation())
    for renderer in (CB_RENDERER, OUR_RENDERER, SHELL_RENDERER):
        ob, stop = asyncio.run(OurSumEnv(renderer, PREFIX).initial_observation())
        assert isinstance(ob, records.ModelInput)
        assert ob.to_ints() == theirs_ob.to_ints()
        assert list(stop) == theirs_stop


_TEXT = st.text(alphabet=st.sampled_from(list("7 -12x\nUser:A")), max_size=12)
_ENDING = st.sampled_from(["stop", "eos", "none", "stop+eos", "two stops", "stop mid"])


def _response(text: str, ending: str) -> list[int]:
    body = TOKENIZER.encode(f" {text}", add_special_tokens=False)
    stop = TOKENIZER.encode("\n\nUser:", add_special_tokens=False)
    return {
        "stop": body + stop,
        "eos": [*body, EOS],
        "none": body,
        "stop+eos": [*body, *stop, EOS],
        "two stops": body + stop + body + stop,
        "stop mid": body + stop + body,
    }[ending]


@settings(max_examples=150, deadline=None)
@given(
    text=_TEXT | st.sampled_from(["7", "-7", "x 7", "  7  ", ""]),
    ending=_ENDING,
    strict=st.booleans(),
    coef=st.sampled_from([0.0, 0.1, 0.3, 1.0, 0.7000000000000001]),
)
def test_problem_env_step_is_bit_equal_to_the_cookbook(
    text: str, ending: str, strict: bool, coef: float
) -> None:
    action = _response(text, ending)
    theirs = _cookbook_step(action, strict, coef)
    ours = asyncio.run(OurSumEnv(CB_RENDERER, PREFIX, coef, strict).step(action))
    _assert_same_step(ours, theirs)
    # rlpure's own role_colon renderer, and shell.cookbook.renderers' (the cookbook's API), terminate
    # and parse as the cookbook's does
    for renderer in (OUR_RENDERER, SHELL_RENDERER):
        with_ours = asyncio.run(OurSumEnv(renderer, PREFIX, coef, strict).step(action))
        _assert_same_step(with_ours, theirs)


def test_the_ported_arithmetic_env_scores_as_the_cookbook_arithmetic_env() -> None:
    from tinker_cookbook.recipes.math_rl import arithmetic_env as cb_arithmetic

    ported = ported_module("recipes/math_rl/arithmetic_env.py")
    prefix = cb_arithmetic.ArithmeticEnv.standard_fewshot_prefix()
    for strict in (True, False):
        ours_env = ported.ArithmeticEnv(12, 30, CB_RENDERER, prefix, 0.2, strict)
        theirs_env = cb_arithmetic.ArithmeticEnv(12, 30, CB_RENDERER, prefix, 0.2, strict)
        ob, stop = asyncio.run(ours_env.initial_observation())
        cb_ob, cb_stop = asyncio.run(theirs_env.initial_observation())
        assert ob.to_ints() == cb_ob.to_ints() and list(stop) == cb_stop
        for text in ("42", "The answer is 42", "41", "", "4,2"):
            for ending in ("stop", "eos", "none", "two stops"):
                action = _response(text, ending)
                ours_env = ported.ArithmeticEnv(12, 30, CB_RENDERER, prefix, 0.2, strict)
                theirs_env = cb_arithmetic.ArithmeticEnv(12, 30, CB_RENDERER, prefix, 0.2, strict)
                _assert_same_step(
                    asyncio.run(ours_env.step(action)), asyncio.run(theirs_env.step(action))
                )


def test_problem_group_builder_matches_the_cookbook_fields_and_tags() -> None:
    ours = env.ProblemGroupBuilder(lambda: OurSumEnv(CB_RENDERER), 3)
    theirs = cb_problem_env.ProblemGroupBuilder(lambda: CookbookSumEnv(CB_RENDERER), 3)
    assert [f.name for f in dataclasses.fields(ours) if not f.kw_only] == [
        f.name for f in dataclasses.fields(theirs)
    ]
    assert ours.logging_tags() == theirs.logging_tags() == ["problems"]
    assert len(asyncio.run(ours.make_envs())) == len(asyncio.run(theirs.make_envs())) == 3
    trajectories: list[Any] = [None, None, None]
    assert asyncio.run(ours.compute_group_rewards(trajectories, [])) == asyncio.run(
        theirs.compute_group_rewards(trajectories, [])
    )


# --- datasets ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Group(env.EnvGroupBuilder):
    """A labelled group builder: `(source, batch, slot)`."""

    label: tuple[int, int, int]

    async def make_envs(self) -> Sequence[env.Env]:
        return []


class Source(env.RLDataset):
    """`sizes[b]` labelled groups in batch `b`; counts `get_batch` calls."""

    def __init__(self, source: int, sizes: Sequence[int]) -> None:
        self.source = source
        self.sizes = list(sizes)
        self.calls = 0

    def get_batch(self, index: int) -> Sequence[env.EnvGroupBuilder]:
        self.calls += 1
        return [Group((self.source, index, slot)) for slot in range(self.sizes[index])]

    def __len__(self) -> int:
        return len(self.sizes)


def _labels(dataset: Any) -> list[list[tuple[int, int, int]]]:
    return [[g.label for g in dataset.get_batch(i)] for i in range(len(dataset))]


@pytest.mark.parametrize("seed", [0, 1, 7, "run-3", 2**40])
@pytest.mark.parametrize("size", [0, 1, 2, 5, 33])
def test_cycle_permutation_matches_the_cookbook(seed: int | str, size: int) -> None:
    for cycle in range(4):
        assert tuple(datasets.cycle_permutation(size, seed, cycle)) == tuple(
            cb_dataset_utils.cycle_permutation(size, seed, cycle)
        )


@pytest.mark.parametrize("shuffle_seed", [None, 0, 3, 12345])
@pytest.mark.parametrize("num_batches", [1, 2, 4, 9])
def test_epoch_batch_index_matches_the_cookbook(shuffle_seed: int | None, num_batches: int) -> None:
    for index in range(num_batches * 5):
        assert datasets.epoch_batch_index(
            index, num_batches, shuffle_seed
        ) == cb_dataset_utils.epoch_batch_index(index, num_batches, shuffle_seed)


@pytest.mark.parametrize("shuffle_seed", [None, 0, 5])
@pytest.mark.parametrize(("num_batches", "num_epochs"), [(1, 1), (3, 1), (3, 4), (6, 2)])
def test_epoch_cycled_dataset_matches_the_cookbook(
    shuffle_seed: int | None, num_batches: int, num_epochs: int
) -> None:
    inner = Source(0, [2] * num_batches)
    ours = datasets.EpochCycledRLDataset(inner, num_epochs, shuffle_seed)
    theirs = cb_dataset_utils.EpochCycledRLDataset(inner, num_epochs, shuffle_seed)  # type: ignore[arg-type]
    assert len(ours) == len(theirs)
    assert _labels(ours) == _labels(theirs)
    for bad in (-1, len(ours)):
        with pytest.raises(IndexError):
            ours.get_batch(bad)
        with pytest.raises(IndexError):
            theirs.get_batch(bad)


def test_epoch_cycled_dataset_refuses_what_the_cookbook_refuses() -> None:
    for bad in (0, -2):
        with pytest.raises(ValueError):
            cb_dataset_utils.EpochCycledRLDataset(Source(0, [1]), bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"EpochCycledRLDataset: num_epochs"):
            datasets.EpochCycledRLDataset(Source(0, [1]), bad)


_BLENDS = [
    # (per-source batch sizes, weights, groups_per_batch, total_batches)
    ([[3, 3, 3]], [1.0], 2, None),
    ([[2, 2, 2, 1], [4, 4]], [0.5, 0.5], 3, None),
    ([[2, 2, 2, 1], [4, 4]], [55, 30], 4, 9),  # cycles both sources, ragged last batch
    ([[1] * 5, [2, 2, 2], [3]], [0.55, 0.30, 0.15], 8, 12),
    ([[5], [1, 1]], [1, 3], 1, None),
    ([[2, 2], [2, 2]], [0.1, 0.9], 5, 0),
]


@pytest.mark.parametrize("seed", [0, 1, 42, 2024])
@pytest.mark.parametrize(("sizes", "weights", "groups_per_batch", "total_batches"), _BLENDS)
def test_interleaved_dataset_matches_the_cookbook_schedule(
    seed: int,
    sizes: list[list[int]],
    weights: list[float],
    groups_per_batch: int,
    total_batches: int | None,
) -> None:
    def build(module: Any, cls: str) -> Any:
        sources = [Source(s, batch_sizes) for s, batch_sizes in enumerate(sizes)]
        return getattr(module, cls)(
            sources=sources,
            weights=list(weights),
            groups_per_batch=groups_per_batch,
            total_batches=total_batches,
            seed=seed,
        )

    ours = build(datasets, "InterleavedRLDataset")
    theirs = build(cb_interleaved, "_InterleavedRLDataset")
    assert len(ours) == len(theirs)
    assert _labels(ours) == _labels(theirs)
    with pytest.raises(IndexError):
        ours.get_batch(len(ours))


@pytest.mark.parametrize(
    ("sources", "weights", "groups_per_batch"),
    [
        ([[1]], [1.0, 2.0], 1),  # length mismatch
        ([], [], 1),  # no source
        ([[1], [1]], [1.0, 0.0], 1),  # a zero weight
        ([[1]], [-1.0], 1),  # a negative weight
        ([[1]], [1.0], 0),  # empty batches
        ([[]], [1.0], 1),  # an empty source
        ([[0]], [1.0], 1),  # a source batch without groups
    ],
)
def test_interleaved_dataset_refuses_what_the_cookbook_refuses(
    sources: list[list[int]], weights: list[float], groups_per_batch: int
) -> None:
    for module, cls in (
        (cb_interleaved, "_InterleavedRLDataset"),
        (datasets, "InterleavedRLDataset"),
    ):
        with pytest.raises(ValueError):
            getattr(module, cls)(
                sources=[Source(s, b) for s, b in enumerate(sources)],
                weights=weights,
                groups_per_batch=groups_per_batch,
            )


def test_interleaved_dataset_refuses_a_short_middle_batch_as_the_cookbook() -> None:
    # batch 1 is shorter than batch 0 and not the last: both raise IndexError when it is read
    for module, cls in (
        (cb_interleaved, "_InterleavedRLDataset"),
        (datasets, "InterleavedRLDataset"),
    ):
        dataset = getattr(module, cls)(
            sources=[Source(0, [3, 1, 3])], weights=[1.0], groups_per_batch=7, total_batches=1
        )
        with pytest.raises(IndexError):
            dataset.get_batch(0)


@dataclasses.dataclass(frozen=True)
class SourceBuilder:
    source: int
    sizes: tuple[int, ...]

    async def __call__(self) -> tuple[env.RLDataset, env.RLDataset | None]:
        return Source(self.source, self.sizes), Source(99, (1,))


@pytest.mark.parametrize("seed", [0, 3])
def test_interleaved_builder_matches_the_cookbook(seed: int) -> None:
    kwargs: dict[str, Any] = {
        "sources": [SourceBuilder(0, (2, 2, 1)), SourceBuilder(1, (3, 3, 3))],
        "weights": [2.0, 1.0],
        "groups_per_batch": 3,
        "total_batches": 6,
        "seed": seed,
    }
    ours_train, ours_test = asyncio.run(datasets.InterleavedRLDatasetBuilder(**kwargs)())
    theirs_train, theirs_test = asyncio.run(cb_interleaved.InterleavedRLDatasetBuilder(**kwargs)())
    assert ours_test is None and theirs_test is None
    assert _labels(ours_train) == _labels(theirs_train)
    assert list(getattr(datasets.InterleavedRLDatasetBuilder, "__chz_fields__")) == list(  # noqa: B009
        cb_interleaved.InterleavedRLDatasetBuilder.__chz_fields__
    )
