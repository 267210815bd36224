"""Tests for the environment API (`shell.env`) and the token completer (`shell.completion`)."""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pytest
import tinker
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.model import EOS_ID, ByteTokenizer
from rlpure.records import ModelInput, StepResult
from rlpure.render import Message, RoleColonRenderer, get_renderer
from shell.completion import (
    TinkerTokenCompleter,
    model_input_from_tinker,
    model_input_to_tinker,
)
from shell.env import Env, EnvGroupBuilder, ProblemEnv, ProblemGroupBuilder
from shell.fakes import FakeSamplingClient

TOKENIZER = ByteTokenizer()
RENDERER = get_renderer("role_colon", TOKENIZER)


class SumEnv(ProblemEnv):
    """`What is a+b?`; the answer must be the number alone."""

    def __init__(self, a: int, b: int, **kwargs: object) -> None:
        super().__init__(RENDERER, **kwargs)  # type: ignore[arg-type]
        self.a, self.b = a, b

    def get_question(self) -> str:
        return f"What is {self.a}+{self.b}?"

    def check_answer(self, sample_str: str) -> bool:
        return sample_str.strip() == str(self.a + self.b)

    def check_format(self, sample_str: str) -> bool:
        return sample_str.strip().isdigit()

    def get_reference_answer(self) -> str:
        return str(self.a + self.b)


def _stop_terminated(text: str) -> list[int]:
    return TOKENIZER.encode(f" {text}\n\nUser:", add_special_tokens=False)


def _eos_terminated(text: str) -> list[int]:
    return [*TOKENIZER.encode(f" {text}", add_special_tokens=False), EOS_ID]


def _truncated(text: str) -> list[int]:
    return TOKENIZER.encode(f" {text}", add_special_tokens=False)


def _step(env: Env, tokens: list[int]) -> StepResult:
    return asyncio.run(env.step(tokens))


async def _prompt(env: Env) -> ModelInput:
    first = await env.initial_observation()
    assert isinstance(first, tuple)
    return first[0]


def test_problem_env_prompt_is_role_colon_with_bos_and_stop_sequence() -> None:
    env = SumEnv(2, 3)
    ob, stop = asyncio.run(env.initial_observation())
    assert ob.to_ints()[0] == TOKENIZER.bos_token_id
    assert TOKENIZER.decode(ob.to_ints()[1:]) == "User: What is 2+3?\n\nAssistant:"
    assert stop == ("\n\nUser:",)


def test_problem_env_convo_prefix_comes_before_the_question() -> None:
    prefix = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
    ob, _ = asyncio.run(SumEnv(2, 3, convo_prefix=prefix).initial_observation())
    text = TOKENIZER.decode(ob.to_ints()[1:])
    assert text == "User: 1+1?\n\nAssistant: 2\n\nUser: What is 2+3?\n\nAssistant:"


@pytest.mark.parametrize(
    ("tokens", "strict", "expected_reward", "expected_format", "expected_correct"),
    [
        (_stop_terminated("5"), True, 1.0, 1.0, 1.0),
        (_stop_terminated("4"), True, 0.0, 1.0, 0.0),
        (_eos_terminated("5"), True, 0.9, 0.0, 1.0),  # strict: EOS is not well-formed
        (_eos_terminated("5"), False, 1.0, 1.0, 1.0),  # lenient: EOS is clean
        (_truncated("5"), False, 0.9, 0.0, 1.0),  # truncated is malformed in both modes
        (_stop_terminated("five"), True, -0.1, 0.0, 0.0),  # check_format rejects it
    ],
)
def test_problem_env_reward_is_format_coef_times_format_minus_one_plus_correct(
    tokens: list[int],
    strict: bool,
    expected_reward: float,
    expected_format: float,
    expected_correct: float,
) -> None:
    env = SumEnv(2, 3, require_stop_sequence_for_format=strict)
    result = _step(env, tokens)
    assert result.reward == pytest.approx(expected_reward)
    assert result.metrics == {"format": expected_format, "correct": expected_correct}
    assert result.episode_done
    assert result.next_observation == ModelInput.empty()
    assert result.logs == {}  # the cookbook's ProblemEnv returns no logs
    logged = _step(
        SumEnv(2, 3, require_stop_sequence_for_format=strict, log_responses=True), tokens
    )
    assert logged.reward == result.reward and logged.metrics == result.metrics
    assert logged.logs["reference_answer"] == "5"
    assert logged.logs["question"] == "What is 2+3?"
    assert logged.logs["response"] == RENDERER.parse_response(tokens).content


@settings(max_examples=40, deadline=None)
@given(
    answer=st.integers(-20, 40),
    coef=st.floats(0.0, 1.0),
    ending=st.sampled_from(["stop", "eos", "truncated"]),
)
def test_problem_env_reward_formula_holds_for_any_response(
    answer: int, coef: float, ending: str
) -> None:
    make = {"stop": _stop_terminated, "eos": _eos_terminated, "truncated": _truncated}[ending]
    result = _step(SumEnv(2, 3, format_coef=coef), make(str(answer)))
    fmt, correct = result.metrics["format"], result.metrics["correct"]
    assert fmt == float(ending == "stop" and answer >= 0)
    assert correct == float(answer == 5)
    assert result.reward == pytest.approx(coef * (fmt - 1.0) + correct)


def test_problem_env_rejects_a_negative_format_coef() -> None:
    with pytest.raises(ValueError, match=r"ProblemEnv\.format_coef"):
        SumEnv(1, 1, format_coef=-0.5)


def test_problem_group_builder_gives_every_env_the_same_problem() -> None:
    builder = ProblemGroupBuilder(lambda: SumEnv(4, 7), num_envs=5, dataset_name="sums")
    envs = asyncio.run(builder.make_envs())
    assert len(envs) == 5
    assert len({id(e) for e in envs}) == 5  # fresh envs
    prompts = {tuple(asyncio.run(_prompt(e)).to_ints()) for e in envs}
    assert len(prompts) == 1
    assert builder.logging_tags() == ["sums"]
    rewards = asyncio.run(builder.compute_group_rewards([], envs))
    assert rewards == []
    assert asyncio.run(builder.cleanup()) is None


def test_problem_group_builder_rejects_an_empty_group() -> None:
    with pytest.raises(ValueError, match=r"ProblemGroupBuilder\.num_envs"):
        ProblemGroupBuilder(lambda: SumEnv(1, 1), num_envs=0)


def test_env_group_builder_default_group_rewards_are_zero() -> None:
    class OneEnv(EnvGroupBuilder):
        async def make_envs(self) -> list[Env]:
            return [SumEnv(1, 1)]

    builder = OneEnv()
    assert asyncio.run(builder.compute_group_rewards([object(), object()], [])) == [  # type: ignore[list-item]
        (0.0, {}),
        (0.0, {}),
    ]
    assert builder.logging_tags() == []


def test_model_input_round_trips_through_tinker() -> None:
    ob = ModelInput.from_ints([5, 0, 258])
    converted = model_input_to_tinker(ob)
    assert isinstance(converted, tinker.ModelInput)
    assert converted.to_ints() == [5, 0, 258]
    assert model_input_from_tinker(converted) == ob


def test_tinker_token_completer_converts_at_the_sdk_edge() -> None:
    client = FakeSamplingClient(vocab_size=7)
    completer = TinkerTokenCompleter(client, max_tokens=3, temperature=0.7, seed=10)
    ob = ModelInput.from_ints([1, 2, 3])
    first = asyncio.run(completer(ob, ("\n\nUser:",)))
    second = asyncio.run(completer(ob, (9,)))
    assert first.tokens.dtype == np.int32 and first.logprobs is not None
    assert first.logprobs.dtype == np.float32
    assert first.stop_reason == "stop"
    assert len(first.tokens) == len(first.logprobs) <= 3
    np.testing.assert_allclose(first.logprobs, -math.log(7), rtol=1e-6)
    assert second.sequence_id is not None
    (p1, n1, params1), (_, _, params2) = client.sample_calls
    assert p1 == [1, 2, 3] and n1 == 1
    assert params1.stop == ["\n\nUser:"] and params2.stop == [9]
    assert params1.max_tokens == 3 and params1.temperature == 0.7
    assert (params1.seed, params2.seed) == (10, 11)  # call n samples with seed + n


def test_tinker_token_completer_validates_options() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        TinkerTokenCompleter(FakeSamplingClient(), max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        TinkerTokenCompleter(FakeSamplingClient(), max_tokens=1, temperature=-1.0)


# --- the cookbook's signatures and renderer API ------------------------------------------------


class CookbookStyleEnv(ProblemEnv):
    """Written as the cookbook's `ArithmeticEnv`: prefix and options passed positionally."""

    def __init__(
        self, renderer: object, convo_prefix: list[Message] | None, format_coef: float
    ) -> None:
        super().__init__(renderer, convo_prefix, format_coef, False)

    def get_question(self) -> str:
        return "What is 2+3?"

    def check_answer(self, sample_str: str) -> bool:
        return sample_str.strip() == "5"

    def check_format(self, sample_str: str) -> bool:
        return sample_str.strip().isdigit()

    def get_reference_answer(self) -> str:
        return "5"


@dataclass(frozen=True)
class Termination:
    is_stop_sequence: bool
    is_clean: bool


class MessageTupleRenderer:
    """A renderer with the cookbook's API over rlpure's role_colon: `parse_response` returns
    `(message, termination)`, the message content a list of parts (text and thinking), and
    `build_generation_prompt` a `tinker.ModelInput`, as `tinker_cookbook.renderers` do."""

    def __init__(self) -> None:
        self.inner = RoleColonRenderer(TOKENIZER)  # its stop sequences are strings

    def get_stop_sequences(self) -> list[str]:
        return list(self.inner.get_stop_sequences())

    def build_generation_prompt(self, messages: list[Mapping[str, str]]) -> tinker.ModelInput:
        return tinker.ModelInput.from_ints(self.inner.build_generation_prompt(messages).to_ints())

    def parse_response(self, tokens: list[int]) -> tuple[dict[str, object], Termination]:
        assert type(tokens) is list  # the cookbook's renderers expect a list
        parsed = self.inner.parse_response(tokens)
        content = [
            {"type": "thinking", "thinking": "hmm 4?"},
            {"type": "text", "text": parsed.content},
        ]
        message: dict[str, object] = {"role": "assistant", "content": content}
        return message, Termination(parsed.is_stop_sequence, parsed.is_clean)


def test_problem_env_takes_the_cookbook_positional_arguments() -> None:
    prefix: list[Message] = [{"role": "user", "content": "1+1?"}]
    env = CookbookStyleEnv(RENDERER, prefix, 0.25)
    assert env.convo_prefix == prefix
    assert env.format_coef == 0.25
    assert env.require_stop_sequence_for_format is False
    assert not env.log_responses
    with pytest.raises(TypeError):
        ProblemEnv.__init__(env, RENDERER, None, 0.1, True, False)  # type: ignore[misc]


@pytest.mark.parametrize(
    "tokens",
    [_stop_terminated("5"), _eos_terminated("5"), _truncated("5"), _stop_terminated("4")],
)
def test_problem_env_gives_the_same_step_with_either_renderer_kind(tokens: list[int]) -> None:
    ours = CookbookStyleEnv(RENDERER, None, 0.1)
    cookbook_api = CookbookStyleEnv(MessageTupleRenderer(), None, 0.1)
    (ob_ours, stop_ours), (ob_api, stop_api) = (
        asyncio.run(ours.initial_observation()),
        asyncio.run(cookbook_api.initial_observation()),
    )
    assert isinstance(ob_api, ModelInput) and ob_api == ob_ours  # a tinker prompt is converted
    assert stop_api == stop_ours == ("\n\nUser:",)
    expected, got = _step(ours, tokens), _step(cookbook_api, tokens)
    assert got == expected
    assert got.logs == {}


def test_problem_env_accepts_an_array_action_too() -> None:
    tokens = _stop_terminated("5")
    assert asyncio.run(SumEnv(2, 3).step(np.asarray(tokens, np.int32))) == _step(  # type: ignore[arg-type]
        SumEnv(2, 3), tokens
    )


def test_problem_group_builder_has_the_cookbook_fields_positionally() -> None:
    builder = ProblemGroupBuilder(lambda: SumEnv(1, 1), 3, "sums", tags=("math",))
    assert (builder.num_envs, builder.dataset_name) == (3, "sums")
    assert builder.logging_tags() == ["sums", "math"]
    with pytest.raises(TypeError):
        ProblemGroupBuilder(lambda: SumEnv(1, 1), 3, "sums", ("math",))  # type: ignore[call-arg]
    groups = asyncio.run(
        builder.compute_group_rewards(trajectory_group=[], env_group=[])  # cookbook keywords
    )
    assert groups == []


def test_env_module_has_the_cookbook_rl_types_names() -> None:
    import shell.env as env_api
    from rlpure import records

    assert env_api.Action == list[int]
    assert env_api.Observation is ModelInput
    assert env_api.StopReason is records.StopReason
    assert env_api.STOP_METRIC_PREFIX == "stop/"
    assert env_api.PARSE_ERROR_MASKED_METRIC_KEY == "parse_error_masked"
    assert env_api.InitialObservationOverflow is records.InitialObservationOverflow
    assert env_api.RolloutError is records.RolloutError
    for name in ("Metrics", "Logs", "StopCondition", "Logprobs", "ActionExtra"):
        assert name in env_api.__all__
    params = list(inspect.signature(EnvGroupBuilder.compute_group_rewards).parameters)
    assert params == ["self", "trajectory_group", "env_group"]
