"""Records: validation errors, immutability, exact msgpack/JSON round trips, and the guarantees
of the `rlpure.testing` strategies (checked against a plain-loop model of the cookbook's
`trajectory_to_data` datum splitting)."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.records import (
    PARSE_ERROR_MASKED_METRIC_KEY,
    ModelInput,
    RolloutError,
    StepResult,
    TokensWithLogprobs,
    Trajectory,
    TrajectoryGroup,
    Transition,
    decode_json,
    decode_msgpack,
    encode_json,
    encode_msgpack,
)
from rlpure.testing import (
    batches,
    model_inputs,
    ragged_rewards,
    tokens_with_logprobs,
    trajectories,
    trajectory_groups,
)

Batch = tuple[TrajectoryGroup, ...]


def _ac(tokens: Any, logprobs: Any = None) -> TokensWithLogprobs:
    if logprobs is None:
        logprobs = [-0.5] * len(tokens)
    return TokensWithLogprobs(tokens=tokens, logprobs=logprobs)


def _transition(**overrides: Any) -> Transition:
    fields: dict[str, Any] = {
        "ob": ModelInput.from_ints([1, 2, 3]),
        "ac": _ac([10, 11]),
        "reward": 1.0,
        "episode_done": True,
    }
    fields.update(overrides)
    return Transition(**fields)


def _group(num: int = 2, **overrides: Any) -> TrajectoryGroup:
    fields: dict[str, Any] = {
        "trajectories_G": tuple(Trajectory(transitions=(_transition(),)) for _ in range(num)),
        "final_rewards_G": tuple(0.0 for _ in range(num)),
        "metrics_G": tuple({} for _ in range(num)),
    }
    fields.update(overrides)
    return TrajectoryGroup(**fields)


# --- validation: errors name the record and the field ------------------------------------------


def test_a_stop_string_is_one_stop_as_the_sdks_stop_parameter() -> None:
    # `tinker.SamplingParams.stop` takes a str as one stop string (it was refused here, and
    # split into characters where an env's initial observation gave one)
    step = StepResult(reward=0.0, episode_done=False, next_observation=[], next_stop_condition="\n")
    assert step.next_stop_condition == ("\n",)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: _ac([1, 2, 3], [-0.1, -0.2]), ValueError, r"TokensWithLogprobs\.logprobs: length 2 != tokens length 3"),
        (lambda: _ac([1, 2], [-0.1, float("nan")]), ValueError, r"TokensWithLogprobs\.logprobs: non-finite"),
        (lambda: _ac([1, 2], [-0.1, float("inf")]), ValueError, r"TokensWithLogprobs\.logprobs: non-finite"),
        (lambda: _ac([1, -2]), ValueError, r"TokensWithLogprobs\.tokens: negative token id -2 at position 1"),
        (lambda: _ac([1.0, 2.0]), TypeError, r"TokensWithLogprobs\.tokens: token ids must be integers"),  # type: ignore[arg-type, list-item]
        (lambda: TokensWithLogprobs(tokens=[1], logprobs=["a"]), TypeError, r"TokensWithLogprobs\.logprobs"),  # type: ignore[arg-type, list-item]
        (lambda: TokensWithLogprobs(tokens=[1], logprobs=[-1.0], stop_reason="eos"), ValueError, r"TokensWithLogprobs\.stop_reason"),  # type: ignore[arg-type]
        (lambda: ModelInput.from_ints([0, -1]), ValueError, r"ModelInput\.tokens: negative token id -1"),
        (lambda: ModelInput.from_ints(np.array([1.5, 2.0])), TypeError, r"ModelInput\.tokens: token ids must be integers, got dtype float64"),
        (lambda: ModelInput.from_ints(np.array([True, False])), TypeError, r"ModelInput\.tokens: token ids must be integers, got dtype bool"),
        (lambda: ModelInput.from_ints([1, 2**31]), ValueError, r"ModelInput\.tokens: token id 2147483648 exceeds int32"),
        (lambda: ModelInput.from_ints([[1, 2]]), ValueError, r"ModelInput\.tokens: expected a 1-D sequence, got shape \(1, 2\)"),  # type: ignore[arg-type, list-item]
        (lambda: ModelInput.from_ints(["a"]), TypeError, r"ModelInput\.tokens"),  # type: ignore[list-item]
        (lambda: _transition(reward=float("nan")), ValueError, r"Transition\.reward: non-finite value nan"),
        (lambda: _transition(reward=float("-inf")), ValueError, r"Transition\.reward: non-finite value -inf"),
        (lambda: _transition(reward="1.0"), TypeError, r"Transition\.reward: expected a real number, got str"),
        (lambda: _transition(reward=True), TypeError, r"Transition\.reward: expected a real number, got bool"),
        (lambda: _transition(ob="12"), TypeError, r"Transition\.ob: expected a ModelInput \(rlpure or tinker\) or a sequence of token ids, got str"),
        (lambda: _transition(ob=[1, -2]), ValueError, r"Transition\.ob: negative token id -2 at position 1"),
        (lambda: _transition(ob=[1.5]), TypeError, r"Transition\.ob: token ids must be integers"),
        (lambda: _transition(ac=ModelInput.from_ints([1])), TypeError, r"Transition\.ac: expected TokensWithLogprobs \(rlpure or cookbook: tokens and maybe_logprobs\), got ModelInput"),
        (lambda: _transition(metrics={"x": None}), TypeError, r"Transition\.metrics\['x'\]: expected int or float, got NoneType"),
        (lambda: _transition(episode_done=1), TypeError, r"Transition\.episode_done"),
        (lambda: _transition(metrics={"x": "high"}), TypeError, r"Transition\.metrics\['x'\]: expected int or float, got str"),
        (lambda: _transition(metrics={3: 1.0}), TypeError, r"Transition\.metrics: key 3 is not a string"),
        (lambda: Trajectory(transitions=(_transition(), "t")), TypeError, r"Trajectory\.transitions\[1\]: expected Transition, got str"),  # type: ignore[arg-type, list-item]
        (lambda: Trajectory(transitions=(_transition(),), final_ob=None), TypeError, r"Trajectory\.final_ob: expected a ModelInput"),  # type: ignore[arg-type]
        (lambda: _group(2, final_rewards_G=(0.0,)), ValueError, r"TrajectoryGroup: trajectories_G has 2 items, final_rewards_G 1, metrics_G 2"),
        (lambda: _group(2, metrics_G=({},)), ValueError, r"TrajectoryGroup: trajectories_G has 2 items, final_rewards_G 2, metrics_G 1"),
        (lambda: _group(2, final_rewards_G=(0.0, float("inf"))), ValueError, r"TrajectoryGroup\.final_rewards_G\[1\]: non-finite value inf"),
        (lambda: _group(2, final_rewards_G=(0.0, None)), TypeError, r"TrajectoryGroup\.final_rewards_G\[1\]: expected a real number"),
        (lambda: _group(1, trajectories_G=(_transition(),)), TypeError, r"TrajectoryGroup\.trajectories_G\[0\]: expected Trajectory, got Transition"),
        (lambda: _group(1, rollout_errors=("boom",)), TypeError, r"TrajectoryGroup\.rollout_errors\[0\]: expected RolloutError"),
        (lambda: StepResult(reward=float("nan"), episode_done=False, next_observation=ModelInput.empty()), ValueError, r"StepResult\.reward: non-finite"),
        (lambda: StepResult(reward=0.0, episode_done=False, next_observation=1), TypeError, r"StepResult\.next_observation: expected a ModelInput \(rlpure or tinker\) or a sequence of token ids, got int"),  # type: ignore[arg-type]
        (lambda: StepResult(reward=0.0, episode_done=False, next_observation=[], next_stop_condition=b"\n"), TypeError, r"StepResult\.next_stop_condition: expected a stop string, or a list or tuple"),  # type: ignore[arg-type]
    ],
)  # fmt: skip
def test_construction_errors_name_record_and_field(build, error, match) -> None:
    with pytest.raises(error, match=match):
        build()


def test_valid_construction_accepts_arrays_and_sequences() -> None:
    from_list = _ac([1, 2, 3], [-0.1, -0.2, -0.3])
    from_arrays = TokensWithLogprobs(
        tokens=np.array([1, 2, 3], np.int64), logprobs=np.array([-0.1, -0.2, -0.3], np.float64)
    )
    assert from_list == from_arrays
    assert from_list.tokens.dtype == np.int32
    assert from_list.logprobs is not None and from_list.logprobs.dtype == np.float32
    assert ModelInput.from_ints([]).length == 0
    assert ModelInput.from_ints(np.array([], np.float64)).tokens.dtype == np.int32  # empty is fine
    group = _group(2, final_rewards_G=np.array([1.0, 0.0]))
    assert group.final_rewards_G == (1.0, 0.0)
    assert group.get_total_rewards() == [2.0, 1.0]


# --- immutability ------------------------------------------------------------------------------


def test_arrays_are_read_only_copies() -> None:
    tokens = np.array([1, 2, 3], np.int32)
    logprobs = np.array([-1.0, -2.0, -3.0], np.float32)
    ac = TokensWithLogprobs(tokens=tokens, logprobs=logprobs)
    ob = ModelInput(tokens=tokens)
    tokens[0] = 99
    logprobs[0] = 0.0
    assert ac.tokens.tolist() == [1, 2, 3]
    assert ac.logprobs is not None and ac.logprobs.tolist() == [-1.0, -2.0, -3.0]
    assert ob.tokens.tolist() == [1, 2, 3]
    for array in (ac.tokens, ac.logprobs, ob.tokens):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 7


def test_records_are_frozen_and_use_tuples() -> None:
    step = _transition()
    traj = Trajectory(transitions=[step])  # type: ignore[arg-type]  # a list becomes a tuple
    group = _group(1, final_rewards_G=[1.0], metrics_G=[{}])
    assert isinstance(traj.transitions, tuple)
    assert isinstance(group.trajectories_G, tuple)
    assert isinstance(group.final_rewards_G, tuple)
    assert isinstance(group.metrics_G, tuple)
    with pytest.raises(AttributeError):
        step.reward = 2.0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        traj.transitions = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        group.final_rewards_G = (0.0,)  # type: ignore[misc]
    ob = ModelInput.from_ints([1, 2])
    assert ob.append([3]).to_ints() == [1, 2, 3]
    assert ob.to_ints() == [1, 2]


# --- exact round trips -------------------------------------------------------------------------


def _assert_identical(a: Any, b: Any, path: str = "$") -> None:
    """Bit-exact structural equality: dtypes and raw bytes of arrays, types of scalars."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape}"
        assert a.tobytes() == b.tobytes(), f"{path}: array bytes differ"
        assert not b.flags.writeable, f"{path}: decoded array is writable"
    elif isinstance(a, msgspec.Struct):
        for field in a.__struct_fields__:
            _assert_identical(getattr(a, field), getattr(b, field), f"{path}.{field}")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_identical(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys differ"
        for key in a:
            _assert_identical(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, float):
        assert math.copysign(1.0, a) == math.copysign(1.0, b) and a == b, f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@settings(max_examples=40, deadline=None)
@given(groups_P=batches(reward_kind="float", with_rollout_errors=True))
def test_msgpack_round_trip_is_exact(groups_P: Batch) -> None:
    decoded = decode_msgpack(encode_msgpack(groups_P), Batch)
    assert decoded == groups_P
    _assert_identical(groups_P, decoded)


@settings(max_examples=40, deadline=None)
@given(groups_P=batches(reward_kind="float", with_rollout_errors=True))
def test_json_round_trip_is_exact(groups_P: Batch) -> None:
    decoded = decode_json(encode_json(groups_P), Batch)
    assert decoded == groups_P
    _assert_identical(groups_P, decoded)


@settings(max_examples=20, deadline=None)
@given(traj=trajectories())
def test_single_record_round_trip(traj: Trajectory) -> None:
    for encode, decode in ((encode_msgpack, decode_msgpack), (encode_json, decode_json)):
        _assert_identical(traj, decode(encode(traj), Trajectory))
        step = traj.transitions[0]
        _assert_identical(step, decode(encode(step), Transition))


def test_rollout_error_and_empty_batch_round_trip() -> None:
    err = RolloutError(error_type="ValueError", error_message="bad env")
    assert decode_msgpack(encode_msgpack(err), RolloutError) == err
    assert decode_json(encode_json(()), Batch) == ()


def test_step_result_round_trip() -> None:
    for stop in ((), ("\n\nUser:",), (7, 9)):
        result = StepResult(
            reward=1.0,
            episode_done=False,
            next_observation=ModelInput.from_ints([1, 2]),
            next_stop_condition=stop,
        )
        assert decode_msgpack(encode_msgpack(result), StepResult) == result
        assert decode_json(encode_json(result), StepResult) == result


@pytest.mark.parametrize("stop", [("a", 1), (-1,), (True,), (1.5,)])
def test_step_result_refuses_mixed_or_bad_stop_conditions(stop) -> None:
    with pytest.raises(TypeError, match=r"StepResult\.next_stop_condition"):
        StepResult(
            reward=0.0,
            episode_done=True,
            next_observation=ModelInput.empty(),
            next_stop_condition=stop,
        )


# --- corrupted input: ValidationError naming the path ------------------------------------------


def _raw(groups_P: Batch) -> Any:
    """The batch as plain msgpack objects (dicts/lists), ready to corrupt and re-encode."""
    return msgspec.msgpack.decode(encode_msgpack(groups_P))


_nonempty_batches = batches(min_groups=1, min_group_size=1, max_turns=2)

_CORRUPTIONS = {
    "nan_reward": (
        lambda step: step.__setitem__("reward", float("nan")),
        r"Transition\.reward: non-finite value nan",
        "",
    ),
    "string_reward": (
        lambda step: step.__setitem__("reward", "1"),
        r"Expected `float`, got `str`",
        ".reward",
    ),
    "extra_logprob": (
        lambda step: step["ac"]["logprobs"].__setitem__(
            "data", step["ac"]["logprobs"]["data"] + b"\x00\x00\x80\xbf"
        ),
        r"TokensWithLogprobs\.logprobs: length \d+ != tokens length \d+",
        ".ac",
    ),
    "negative_token": (
        lambda step: step["ob"].__setitem__(
            "tokens", {"dtype": "<i4", "data": np.array([1, -5], "<i4").tobytes()}
        ),
        r"ModelInput\.tokens: negative token id -5 at position 1",
        ".ob",
    ),
    "float_tokens": (
        lambda step: step["ob"].__setitem__(
            "tokens", {"dtype": "<f4", "data": np.array([1, 2], "<f4").tobytes()}
        ),
        r"ModelInput\.tokens: token ids must be integers",
        ".ob",
    ),
    "unknown_dtype": (
        lambda step: step["ac"]["tokens"].__setitem__("dtype", "<f2"),
        r"array: unsupported wire form",
        ".ac.tokens",
    ),
    "ragged_bytes": (
        lambda step: step["ob"]["tokens"].__setitem__("data", b"\x01\x00\x00"),
        r"array: 3 bytes is not a whole number of <i4",
        ".ob.tokens",
    ),
    "bad_stop_reason": (
        lambda step: step["ac"].__setitem__("stop_reason", "eos"),
        r"Invalid enum value 'eos'",
        ".ac.stop_reason",
    ),
}


@settings(max_examples=30, deadline=None)
@given(groups_P=_nonempty_batches, data=st.data(), kind=st.sampled_from(sorted(_CORRUPTIONS)))
def test_corrupted_transition_raises_validation_error_with_path(
    groups_P: Batch, data: st.DataObject, kind: str
) -> None:
    raw = _raw(groups_P)
    p = data.draw(st.integers(0, len(raw) - 1))
    g = data.draw(st.integers(0, len(raw[p]["trajectories_G"]) - 1))
    transitions = raw[p]["trajectories_G"][g]["transitions"]
    t = data.draw(st.integers(0, len(transitions) - 1))
    corrupt, message, suffix = _CORRUPTIONS[kind]
    corrupt(transitions[t])
    path = f"$[{p}].trajectories_G[{g}].transitions[{t}]{suffix}"
    with pytest.raises(msgspec.ValidationError, match=message) as info:
        decode_msgpack(msgspec.msgpack.encode(raw), Batch)
    assert str(info.value).endswith(f"- at `{path}`"), str(info.value)


@settings(max_examples=20, deadline=None)
@given(groups_P=_nonempty_batches, data=st.data())
def test_corrupted_group_lengths_raise_validation_error_with_path(
    groups_P: Batch, data: st.DataObject
) -> None:
    raw = _raw(groups_P)
    p = data.draw(st.integers(0, len(raw) - 1))
    raw[p]["final_rewards_G"].append(0.5)
    with pytest.raises(
        msgspec.ValidationError, match=r"TrajectoryGroup: trajectories_G has"
    ) as info:
        decode_msgpack(msgspec.msgpack.encode(raw), Batch)
    assert str(info.value).endswith(f"- at `$[{p}]`")
    raw[p]["final_rewards_G"].pop()
    raw[p]["final_rewards_G"][0] = float("inf")
    with pytest.raises(msgspec.ValidationError, match=r"final_rewards_G\[0\]: non-finite") as info:
        decode_msgpack(msgspec.msgpack.encode(raw), Batch)
    assert str(info.value).endswith(f"- at `$[{p}]`")


def test_corrupted_json_names_path() -> None:
    data = encode_json((_group(2),))
    bad = data.replace(b'"tokens":[1,2,3]', b'"tokens":[1,2.5,3]', 1)
    with pytest.raises(msgspec.ValidationError, match=r"ModelInput\.tokens: token ids must be "):
        decode_json(bad, Batch)
    bad = data.replace(b'"logprobs":[-0.5,-0.5]', b'"logprobs":[-0.5]', 1)
    with pytest.raises(
        msgspec.ValidationError,
        match=r"length 1 != tokens length 2 - at `\$\[0\]\.trajectories_G\[0\]\.transitions\[0\]\.ac`",
    ):
        decode_json(bad, Batch)
    bad = data.replace(b'"tokens":[1,2,3]', b'"tokens":[1,3000000000,3]', 1)
    with pytest.raises(msgspec.ValidationError, match=r"exceeds int32"):
        decode_json(bad, Batch)


def test_truncated_input_raises_decode_error() -> None:
    data = encode_msgpack((_group(2),))
    with pytest.raises(msgspec.DecodeError):
        decode_msgpack(data[:-5], Batch)
    with pytest.raises(msgspec.DecodeError):
        decode_json(encode_json((_group(2),))[:-5], Batch)


# --- the strategies keep their documented guarantees -------------------------------------------


def _cookbook_datum_lengths(traj: Trajectory) -> list[int]:
    """Full-sequence length of each datum the cookbook's `trajectory_to_data` would build."""
    lengths: list[int] = []
    sequence: list[int] = []
    for step in traj.transitions:
        ob = step.ob.to_ints()
        if not sequence:
            delta = ob
        elif len(sequence) <= len(ob) and ob[: len(sequence)] == sequence:
            delta = ob[len(sequence) :]
        else:
            lengths.append(len(sequence))
            sequence = []
            delta = ob
        sequence.extend(delta)
        sequence.extend(step.ac.tokens.tolist())
    if sequence:
        lengths.append(len(sequence))
    return lengths


@settings(max_examples=60, deadline=None)
@given(
    prefix=st.sampled_from(("always", "never", "mixed")),
    masked_turns=st.booleans(),
    data=st.data(),
)
def test_trajectory_strategy_guarantees(prefix, masked_turns: bool, data: st.DataObject) -> None:
    traj = data.draw(trajectories(prefix=prefix, masked_turns=masked_turns, max_turns=4))
    steps = traj.transitions
    assert 1 <= len(steps) <= 4
    assert [t.episode_done for t in steps] == [False] * (len(steps) - 1) + [True]
    lengths = _cookbook_datum_lengths(traj)
    assert all(n >= 2 for n in lengths), lengths
    if prefix == "always":
        assert len(lengths) == 1
    if prefix == "never":
        assert len(lengths) == len(steps)
    for step in steps:
        assert step.reward in (0.0, 1.0)
        assert step.ac.logprobs is not None
        assert np.all(step.ac.logprobs <= 0) and np.all(np.isfinite(step.ac.logprobs))
        assert step.ob.length >= 2
        if not masked_turns:
            assert PARSE_ERROR_MASKED_METRIC_KEY not in step.metrics


@settings(max_examples=40, deadline=None)
@given(groups_P=batches(max_groups=6, max_group_size=4))
def test_batch_strategy_guarantees(groups_P: Batch) -> None:
    assert 1 <= len(groups_P) <= 6
    for group in groups_P:
        assert 1 <= len(group.trajectories_G) <= 4
        for total in group.get_total_rewards():
            assert total == int(total)  # binary: integer totals, exact sums


def test_strategies_cover_the_interesting_cases() -> None:
    """Each documented case actually occurs (group of one, empty action, masked turn, break)."""
    seen: set[str] = set()

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(groups_P=batches())
    def collect(groups_P: Batch) -> None:
        for group in groups_P:
            if len(group.trajectories_G) == 1:
                seen.add("group_of_one")
            if len(set(group.get_total_rewards())) == 1 and len(group.trajectories_G) > 1:
                seen.add("constant_group")
            for traj in group.trajectories_G:
                if len(_cookbook_datum_lengths(traj)) > 1:
                    seen.add("prefix_break")
                if len(traj.transitions) > 1 and len(_cookbook_datum_lengths(traj)) == 1:
                    seen.add("merged_turns")
                for step in traj.transitions:
                    if step.ac.tokens.size == 0:
                        seen.add("empty_action")
                    if step.metrics.get(PARSE_ERROR_MASKED_METRIC_KEY) == 1.0:
                        seen.add("masked_turn")

    collect()
    expected = {"group_of_one", "constant_group", "prefix_break", "merged_turns"}
    assert expected | {"empty_action", "masked_turn"} <= seen


@settings(max_examples=30, deadline=None)
@given(
    ob=model_inputs(min_size=2, max_size=5),
    ac=tokens_with_logprobs(0, 5, min_logprob=-3.0),
    rewards_P=ragged_rewards(reward_kind="float", reward_bound=10.0),
    group=trajectory_groups(min_group_size=0, max_group_size=2, reward_kind="float"),
)
def test_small_strategies(ob, ac, rewards_P, group) -> None:
    assert 2 <= ob.length <= 5 and ob.tokens.dtype == np.int32
    assert ac.logprobs is not None and ac.logprobs.dtype == np.float32
    assert np.all((ac.logprobs >= -3.0) & (ac.logprobs <= 0.0))
    for rewards_G in rewards_P:
        assert all(abs(r) <= 10.0 and float(np.float32(r)) == r for r in rewards_G)
    assert len(group.trajectories_G) <= 2


# --- contract checks added after review ---------------------------------------------------------


def test_int64_token_ids_that_would_wrap_are_refused() -> None:
    for bad in (-(2**32) + 5, -(2**32)):
        with pytest.raises(ValueError, match=r"TokensWithLogprobs\.tokens: negative token id"):
            TokensWithLogprobs(tokens=np.array([1, bad], np.int64), logprobs=[-1.0, -1.0])
    wire = {"tokens": {"dtype": "<i8", "data": np.array([-(2**32) + 7], "<i8").tobytes()}}
    with pytest.raises(msgspec.ValidationError, match="negative token id"):
        decode_msgpack(msgspec.msgpack.encode(wire), ModelInput)


def test_model_input_append_refuses_fractional_tokens() -> None:
    with pytest.raises(TypeError, match=r"ModelInput\.tokens: token ids must be integers"):
        ModelInput.from_ints([1]).append([1.7])  # type: ignore[list-item]


def test_positive_logprobs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"TokensWithLogprobs\.logprobs: log-probability 0\.5"):
        TokensWithLogprobs(tokens=[1, 2], logprobs=[-0.1, 0.5])


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_metrics_are_refused(value: float) -> None:
    with pytest.raises(ValueError, match=r"Transition\.metrics\['parse_error_masked'\]"):
        Transition(
            ob=ModelInput.empty(),
            ac=TokensWithLogprobs(tokens=[], logprobs=[]),
            reward=0.0,
            episode_done=True,
            metrics={"parse_error_masked": value},
        )


def test_field_types_are_checked_on_every_record() -> None:
    ob = ModelInput.from_ints([1])
    with pytest.raises(TypeError, match=r"StepResult\.episode_done: expected bool"):
        StepResult(reward=0.0, episode_done="no", next_observation=ob)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"StepResult\.logs\['x'\]: expected str, int or float"):
        StepResult(reward=0.0, episode_done=True, next_observation=ob, logs={"x": [1]})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"Trajectory\.stop_reason: expected str or None"):
        Trajectory(transitions=(), stop_reason=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"RolloutError\.error_message: expected str"):
        RolloutError(error_type="E", error_message=None)  # type: ignore[arg-type]


def test_array_final_rewards_are_read_as_numbers() -> None:
    import jax.numpy as jnp

    group = TrajectoryGroup(
        trajectories_G=(Trajectory(transitions=()),) * 2,
        final_rewards_G=jnp.array([1.0, 0.0]),  # type: ignore[arg-type]
        metrics_G=({}, {}),
    )
    assert group.final_rewards_G == (1.0, 0.0)


@settings(max_examples=60, deadline=None)
@given(traj=trajectories(reward_kind="float"), first=st.sampled_from([-0.0, 0.0, 1.0, -2.5]))
def test_total_step_reward_is_pythons_left_to_right_sum(traj: Trajectory, first: float) -> None:
    # The cookbook sums with `sum(...)`, which starts from int 0: a lone -0.0 gives 0.0.
    one = Trajectory(transitions=(msgspec.structs.replace(traj.transitions[0], reward=first),))
    for t in (traj, one):
        want = sum(step.reward for step in t.transitions)
        got = t.total_step_reward()
        assert (repr(got), type(got)) == (repr(want), type(want))


def test_hostile_input_raises_validation_error_not_recursion_or_unicode_errors() -> None:
    data = encode_json((_group(2),))
    deep = b"[" * 100_000 + b"1" + b"]" * 100_000  # an array field decodes through the hook
    nested = data.replace(b'"tokens":[10,11]', b'"tokens":' + deep, 1)
    bad_utf8 = data.replace(b'"stop_reason":"stop"', b'"stop_reason":"st\xffp"', 1)
    for hostile in (nested, bad_utf8):
        with pytest.raises(msgspec.ValidationError):
            decode_json(hostile, Batch)
    with pytest.raises(msgspec.ValidationError, match="nested too deeply"):
        decode_json(deep, list[Any])
    with pytest.raises(msgspec.ValidationError, match="invalid UTF-8"):
        decode_msgpack(b"\x91\xa3\xffab", list[str])  # [str of 3 bytes, not UTF-8]
    with pytest.raises(msgspec.ValidationError, match="nested too deeply"):
        decode_msgpack(b"\x91" * 100_000 + b"\x01", list[Any])


def test_token_fields_are_truthy_when_non_empty_like_a_list() -> None:
    # cookbook renderers test `if response and response[-1] == eos` on `transition.ac.tokens`
    from rlpure.records import TokenIds

    action = TokensWithLogprobs(tokens=[5, 6, 7])
    assert isinstance(action.tokens, TokenIds) and action.tokens
    assert not TokensWithLogprobs(tokens=[]).tokens
    assert action.tokens[:-1] and isinstance(action.tokens[:-1], TokenIds)
    assert not ModelInput.empty().tokens and ModelInput.from_ints([1, 2]).tokens
    assert action.tokens.dtype == np.int32 and not action.tokens.flags.writeable


def test_cookbook_style_dataclasses_replace_builds_a_checked_record() -> None:
    # cookbook code (e.g. recipes/rl_numerics_check/env.py) calls dataclasses.replace on a
    # StepResult; the copy goes through the constructor, so its checks still run
    import dataclasses

    result = StepResult(reward=1.0, episode_done=False, next_observation=[1, 2], metrics={"a": 1})
    copy = dataclasses.replace(result, metrics={**result.metrics, "extension_rate": 0.5})
    assert copy.metrics == {"a": 1, "extension_rate": 0.5}
    assert (copy.reward, copy.episode_done, list(copy.next_observation.tokens)) == (
        1.0,
        False,
        [1, 2],
    )
    assert [f.name for f in dataclasses.fields(result)] == list(StepResult.__struct_fields__)
    with pytest.raises(ValueError, match=r"StepResult.reward: non-finite"):
        dataclasses.replace(result, reward=float("nan"))
    ac = TokensWithLogprobs(tokens=[3, 4], maybe_logprobs=[-0.1, -0.2])
    transition = Transition(ob=[1, 2], ac=ac, reward=0.0, episode_done=True)
    assert dataclasses.replace(transition, reward=2.0).reward == 2.0
    assert dataclasses.asdict(transition)["reward"] == 0.0
