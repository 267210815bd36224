"""Records accept what cookbook env code hands them and convert it at construction.

`tinker.ModelInput` (a project dependency; rlpure itself never imports it), plain lists, the
cookbook completer's `TokensWithLogprobs` shape (here a dataclass with the same fields, since
the cookbook is not installed in CI; tests/parity checks the real one), list stop conditions
and bool metrics. The stored form is always the frozen numpy one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import tinker
from tinker import types as tinker_types

from rlpure.records import (
    STOP_METRIC_PREFIX,
    InitialObservationOverflow,
    ModelInput,
    StepResult,
    StopReason,
    TokensWithLogprobs,
    Trajectory,
    Transition,
    as_model_input,
    as_tokens_with_logprobs,
    decode_json,
    decode_msgpack,
    encode_json,
    encode_msgpack,
)


@dataclass
class CookbookTokens:
    """The fields of `tinker_cookbook.completers.TokensWithLogprobs`."""

    tokens: list[int]
    maybe_logprobs: list[float] | None
    stop_reason: str = "stop"
    sequence_id: str | None = None
    prompt_cache_hit_tokens: int = 0


def _ac() -> TokensWithLogprobs:
    return TokensWithLogprobs(tokens=[7, 8], logprobs=[-0.5, -0.25])


@pytest.mark.parametrize(
    "given",
    [
        tinker.ModelInput.from_ints([1, 2, 3]),
        [1, 2, 3],
        (1, 2, 3),
        np.array([1, 2, 3], np.int64),
        ModelInput.from_ints([1, 2, 3]),
    ],
    ids=["tinker", "list", "tuple", "array", "rlpure"],
)
def test_observation_fields_convert_every_accepted_form(given: Any) -> None:
    transition = Transition(ob=given, ac=_ac(), reward=0.0, episode_done=True)
    step = StepResult(reward=0.0, episode_done=True, next_observation=given)
    trajectory = Trajectory(transitions=[transition], final_ob=given)
    for ob in (transition.ob, step.next_observation, trajectory.final_ob):
        assert isinstance(ob, ModelInput)
        assert ob.tokens.dtype == np.int32 and not ob.tokens.flags.writeable
        assert ob.to_ints() == [1, 2, 3]


def test_a_given_rlpure_model_input_is_kept_and_a_list_is_copied() -> None:
    ob = ModelInput.from_ints([1])
    assert Transition(ob=ob, ac=_ac(), reward=0.0, episode_done=True).ob is ob
    ids = [4, 5]
    step = StepResult(reward=0.0, episode_done=True, next_observation=ids)
    ids.append(6)
    assert step.next_observation.to_ints() == [4, 5]


def test_an_empty_tinker_model_input_is_an_empty_observation() -> None:
    step = StepResult(reward=1.0, episode_done=True, next_observation=tinker.ModelInput.empty())
    assert step.next_observation == ModelInput.empty()


def test_a_tinker_model_input_with_an_image_chunk_is_one_clear_error() -> None:
    image = tinker_types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4)
    mixed = tinker.ModelInput(chunks=[tinker_types.EncodedTextChunk(tokens=[1, 2]), image])
    with pytest.raises(ValueError) as err:
        StepResult(reward=0.0, episode_done=True, next_observation=mixed)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("StepResult.next_observation: a ModelInput with image chunks")
    with pytest.raises(ValueError, match=r"^Transition\.ob: a ModelInput with image chunks"):
        Transition(ob=mixed, ac=_ac(), reward=0.0, episode_done=True)


def test_a_failing_to_ints_is_one_line_naming_the_field() -> None:
    class Broken:
        def to_ints(self) -> list[int]:
            raise ValueError("only text\nsecond line")

    with pytest.raises(
        ValueError, match=r"^Trajectory\.final_ob: Broken\.to_ints\(\) failed: only text$"
    ):
        Trajectory(transitions=[], final_ob=Broken())


def test_bad_observations_name_record_and_field_and_never_say_model_input_twice() -> None:
    for bad in ("1 2", 3, None, {"tokens": [1]}):
        with pytest.raises(TypeError) as err:
            Transition(ob=bad, ac=_ac(), reward=0.0, episode_done=True)  # type: ignore[arg-type]
        assert str(err.value) == (
            "Transition.ob: expected a ModelInput (rlpure or tinker) or a sequence of token "
            f"ids, got {type(bad).__name__}"
        )


def test_the_cookbook_tokens_with_logprobs_converts_with_all_its_fields() -> None:
    given = CookbookTokens([3, 4], [-1.0, -2.0], stop_reason="length", sequence_id="s-1")
    transition = Transition(ob=[1], ac=given, reward=0.5, episode_done=False)
    assert transition.ac == TokensWithLogprobs(
        tokens=[3, 4], logprobs=[-1.0, -2.0], stop_reason="length", sequence_id="s-1"
    )
    no_logprobs = as_tokens_with_logprobs(CookbookTokens([3], None))
    assert no_logprobs.logprobs is None and no_logprobs.stop_reason == "stop"

    @dataclass
    class Minimal:  # stop_reason and sequence_id are optional
        tokens: list[int]
        maybe_logprobs: list[float] | None

    assert as_tokens_with_logprobs(Minimal([1], [-0.1])).sequence_id is None


def test_an_invalid_cookbook_action_names_transition_ac() -> None:
    with pytest.raises(
        ValueError, match=r"^Transition\.ac: TokensWithLogprobs\.logprobs: length 1"
    ):
        Transition(ob=[1], ac=CookbookTokens([3, 4], [-1.0]), reward=0.0, episode_done=True)
    with pytest.raises(
        TypeError, match=r"^Transition\.ac: expected TokensWithLogprobs .*got list$"
    ):
        Transition(ob=[1], ac=[3, 4], reward=0.0, episode_done=True)  # type: ignore[arg-type]


def test_stop_conditions_accept_lists_and_a_bare_string_as_one_stop() -> None:
    by_text = StepResult(
        reward=0.0, episode_done=False, next_observation=[1], next_stop_condition=["\n\nUser:"]
    )
    by_id = StepResult(
        reward=0.0, episode_done=False, next_observation=[1], next_stop_condition=[2, 5]
    )
    assert by_text.next_stop_condition == ("\n\nUser:",)
    assert by_id.next_stop_condition == (2, 5)
    # a bare string is one stop string, as `tinker.SamplingParams.stop` takes it (it was
    # refused here, and split into characters elsewhere); bytes are not a stop condition
    bare = StepResult(
        reward=0.0, episode_done=False, next_observation=[1], next_stop_condition="ab"
    )
    assert bare.next_stop_condition == ("ab",)
    with pytest.raises(TypeError, match=r"^StepResult\.next_stop_condition: expected a stop"):
        StepResult(reward=0.0, episode_done=False, next_observation=[1], next_stop_condition=b"ab")  # type: ignore[arg-type]


def test_bool_metrics_and_logs_are_stored_as_one_and_zero() -> None:
    transition = Transition(
        ob=[1],
        ac=_ac(),
        reward=0.0,
        episode_done=True,
        metrics={"format": True, "correct": np.bool_(False), "n": 3},  # type: ignore[dict-item]
        logs={"valid": False, "text": "x"},
    )
    assert transition.metrics == {"format": 1.0, "correct": 0.0, "n": 3}
    assert all(type(v) is not bool for v in transition.metrics.values())
    assert transition.logs == {"valid": 0.0, "text": "x"}
    step = StepResult(reward=0.0, episode_done=True, next_observation=[], metrics={"ok": True})
    assert step.metrics == {"ok": 1.0}
    # the stored form round-trips (a stored bool would not decode as `int | float`)
    assert decode_msgpack(encode_msgpack(transition), Transition) == transition
    assert decode_json(encode_json(step), StepResult) == step


def test_rewards_and_episode_done_still_refuse_the_wrong_kind() -> None:
    with pytest.raises(TypeError, match=r"Transition\.reward: expected a real number, got bool"):
        Transition(ob=[1], ac=_ac(), reward=True, episode_done=True)
    with pytest.raises(TypeError, match=r"StepResult\.episode_done: expected bool, got int"):
        StepResult(reward=0.0, episode_done=1, next_observation=[])  # type: ignore[arg-type]


def test_stop_reason_has_the_cookbook_values_and_is_stored_as_a_plain_string() -> None:
    assert [r.value for r in StopReason] == [
        "completed",
        "tool_stopped",
        "max_turns",
        "max_tokens",
        "max_sampled_tokens",
        "max_tool_calls",
        "context_overflow",
        "parse_error",
        "rollout_timeout",
    ]
    assert STOP_METRIC_PREFIX + StopReason.MAX_TOKENS == "stop/max_tokens"
    trajectory = Trajectory(transitions=[], final_ob=[], stop_reason=StopReason.MAX_TURNS)
    assert type(trajectory.stop_reason) is str and trajectory.stop_reason == "max_turns"
    assert decode_json(encode_json(trajectory), Trajectory) == trajectory


def test_initial_observation_overflow_is_a_validated_frozen_record() -> None:
    overflow = InitialObservationOverflow(reward=-1, metrics={"stop/max_tokens": True})
    assert overflow.reward == -1.0 and type(overflow.reward) is float
    assert overflow.metrics == {"stop/max_tokens": 1.0} and overflow.logs == {}
    with pytest.raises(AttributeError):
        overflow.reward = 0.0  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"InitialObservationOverflow\.reward: non-finite"):
        InitialObservationOverflow(reward=float("nan"))
    with pytest.raises(TypeError, match=r"InitialObservationOverflow\.metrics\['x'\]"):
        InitialObservationOverflow(reward=0.0, metrics={"x": "big"})  # type: ignore[dict-item]
    assert decode_msgpack(encode_msgpack(overflow), InitialObservationOverflow) == overflow


def test_as_model_input_names_the_given_destination() -> None:
    assert as_model_input([]).length == 0
    with pytest.raises(ValueError, match=r"^Env\.prompt: negative token id -1 at position 0$"):
        as_model_input([-1], record="Env", field="prompt")


def test_tokens_with_logprobs_takes_the_cookbook_constructor_keywords() -> None:
    built = TokensWithLogprobs(
        tokens=[1, 2], maybe_logprobs=[-1.0, -2.0], prompt_cache_hit_tokens=5
    )
    assert built == TokensWithLogprobs(
        tokens=[1, 2], logprobs=[-1.0, -2.0], prompt_cache_hit_tokens=5
    )
    assert built.maybe_logprobs is built.logprobs
    assert TokensWithLogprobs(tokens=[], maybe_logprobs=[]).logprobs is not None
    assert TokensWithLogprobs(tokens=[1], maybe_logprobs=None).logprobs is None
    assert decode_msgpack(encode_msgpack(built), TokensWithLogprobs) == built
    # a record written before the field existed decodes with the default
    assert decode_json(b'{"tokens": [1]}', TokensWithLogprobs).prompt_cache_hit_tokens == 0
    with pytest.raises(TypeError, match=r"^TokensWithLogprobs: give logprobs or maybe_logprobs"):
        TokensWithLogprobs(tokens=[1], logprobs=[-1.0], maybe_logprobs=[-1.0])
    with pytest.raises(ValueError, match=r"TokensWithLogprobs\.prompt_cache_hit_tokens: -1 < 0"):
        TokensWithLogprobs(tokens=[1], prompt_cache_hit_tokens=-1)
    with pytest.raises(TypeError, match=r"prompt_cache_hit_tokens: expected int, got bool"):
        TokensWithLogprobs(tokens=[1], prompt_cache_hit_tokens=True)
    cookbook = as_tokens_with_logprobs(CookbookTokens([1], [-0.5], prompt_cache_hit_tokens=2))
    assert cookbook.prompt_cache_hit_tokens == 2
