"""Golden cases for trajectory → datum assembly (hand-computed, from the cookbook's rules)."""

import numpy as np
import pytest

from rlpure.buckets import bucket_size
from rlpure.packing import assemble_batch, check_datum_batch, datum_arrays
from rlpure.records import ModelInput, TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition


def _ac(tokens: list[int]) -> TokensWithLogprobs:
    return TokensWithLogprobs(tokens=tokens, logprobs=[-0.5 - i for i in range(len(tokens))])


def _transition(ob: list[int], ac: list[int], *, masked: bool = False) -> Transition:
    metrics = {"parse_error_masked": 1.0} if masked else {}
    return Transition(
        ob=ModelInput.from_ints(ob), ac=_ac(ac), reward=0.0, episode_done=False, metrics=metrics
    )


def _group(*trajs: Trajectory) -> TrajectoryGroup:
    n = len(trajs)
    return TrajectoryGroup(trajectories_G=trajs, final_rewards_G=(0.0,) * n, metrics_G=({},) * n)


def _datums(traj: Trajectory, advantage: float) -> list[dict[str, list]]:
    batch = assemble_batch([_group(traj)], [[advantage]])
    check_datum_batch(batch)
    return [
        {k: v.tolist() for k, v in datum_arrays(batch, d).items()} for d in range(batch.num_datums)
    ]


OB1 = [1, 2, 3, 4, 5]
AC1 = [10, 11, 12]
OB2 = [*OB1, *AC1, 20, 21]
AC2 = [30, 31]
OB3 = [*OB2, *AC2, 40]
AC3 = [50, 51, 52]


def _three_turns(*, mask_middle: bool = False) -> Trajectory:
    return Trajectory(
        transitions=(
            _transition(OB1, AC1),
            _transition(OB2, AC2, masked=mask_middle),
            _transition(OB3, AC3),
        )
    )


def test_single_turn():
    (datum,) = _datums(Trajectory(transitions=(_transition([1, 2, 3], [10, 11, 12]),)), 0.25)
    assert datum["input_tokens"] == [1, 2, 3, 10, 11]
    assert datum["target_tokens"] == [2, 3, 10, 11, 12]
    assert datum["mask"] == [0, 0, 1, 1, 1]
    assert datum["advantages"] == [0, 0, 0.25, 0.25, 0.25]
    assert datum["logprobs"] == [0, 0, -0.5, -1.5, -2.5]


def test_three_turns_with_prefix_merge_into_one_datum():
    (datum,) = _datums(_three_turns(), 1.0)
    assert datum["input_tokens"] == [1, 2, 3, 4, 5, 10, 11, 12, 20, 21, 30, 31, 40, 50, 51]
    assert datum["target_tokens"] == [2, 3, 4, 5, 10, 11, 12, 20, 21, 30, 31, 40, 50, 51, 52]
    assert datum["mask"] == [0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1]
    assert datum["logprobs"] == [
        0,
        0,
        0,
        0,
        -0.5,
        -1.5,
        -2.5,
        0,
        0,
        -0.5,
        -1.5,
        0,
        -0.5,
        -1.5,
        -2.5,
    ]


def test_non_prefix_observation_starts_a_new_datum():
    traj = Trajectory(transitions=(_transition([1, 2], [3, 4]), _transition([7, 8], [9, 6])))
    first, second = _datums(traj, 1.0)
    assert first["mask"] == second["mask"] == [0, 1, 1]
    assert first["target_tokens"] == [2, 3, 4]
    assert second["input_tokens"] == [7, 8, 9]
    assert second["target_tokens"] == [8, 9, 6]


@pytest.mark.parametrize("position", [0, 4, 7])
def test_observation_differing_in_one_token_from_the_sequence_so_far_breaks(position):
    # OB1 + AC1 has 8 tokens; position 7 is the last action token.
    ob2 = [*OB1, *AC1, 20, 21]
    ob2[position] += 100
    traj = Trajectory(transitions=(_transition(OB1, AC1), _transition(ob2, AC2)))
    first, second = _datums(traj, 1.0)
    assert first["target_tokens"] == [*OB1[1:], *AC1]
    assert second["input_tokens"] == [*ob2, AC2[0]]


def test_observation_shorter_than_the_sequence_so_far_breaks():
    traj = Trajectory(transitions=(_transition(OB1, AC1), _transition(OB1, AC2)))
    first, second = _datums(traj, 1.0)
    assert first["target_tokens"] == [*OB1[1:], *AC1]
    assert second["target_tokens"] == [*OB1[1:], *AC2]


def test_parse_error_masked_turn_gets_mask_and_advantage_zero():
    (datum,) = _datums(_three_turns(mask_middle=True), 2.0)
    assert datum["mask"] == [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1]
    assert datum["advantages"] == [0, 0, 0, 0, 2, 2, 2, 0, 0, 0, 0, 0, 2, 2, 2]
    # The masked turn's sampled logprobs are still recorded, as in the cookbook.
    assert datum["logprobs"][9:11] == [-0.5, -1.5]


def test_padding_is_zero_and_rows_beyond_num_datums_are_marked():
    short = Trajectory(transitions=(_transition([1], [2]),))
    long = Trajectory(transitions=(_transition([1, 2, 3], [4, 5, 6, 7]),))
    batch = assemble_batch([_group(short, long)], [[1.0, -1.0]], min_datums=4)
    assert batch.num_datums == 2
    assert batch.length_D.tolist() == [1, 6, 0, 0]
    assert batch.group_idx_D.tolist() == [0, 0, -1, -1]
    assert batch.traj_idx_D.tolist() == [0, 1, -1, -1]
    for field in ("target_tokens_D_T", "logprobs_D_T", "advantages_D_T"):
        arr = np.asarray(getattr(batch, field))
        assert not arr[0, 1:].any(), field
        assert not arr[1, 6:].any(), field
        assert not arr[2:].any(), field
    # The inputs share the targets' buffer: at its length a datum's row holds its last token.
    inputs = np.asarray(batch.input_tokens_D_T)
    assert inputs[0, :3].tolist() == [1, 2, 0] and not inputs[0, 2:].any()
    assert inputs[1, :8].tolist() == [1, 2, 3, 4, 5, 6, 7, 0] and not inputs[1, 7:].any()
    assert not inputs[2:].any()


def test_datum_with_a_single_token_is_refused_naming_the_trajectory():
    lonely = Trajectory(transitions=(_transition([1], []),))
    with pytest.raises(
        ValueError, match=r"groups_P\[0\]\.trajectories_G\[0\]: a datum would hold 1"
    ):
        assemble_batch([_group(lonely)], [[0.0]])


def test_missing_logprobs_are_refused_naming_the_transition():
    t = Transition(
        ob=ModelInput.from_ints([1, 2]),
        ac=TokensWithLogprobs(tokens=[3]),
        reward=0.0,
        episode_done=True,
    )
    with pytest.raises(ValueError, match=r"trajectories_G\[0\]\.transitions\[0\]\.ac\.logprobs"):
        assemble_batch([_group(Trajectory(transitions=(t,)))], [[0.0]])


def test_advantage_shape_mismatch_is_refused():
    g = _group(_three_turns(), _three_turns())
    with pytest.raises(ValueError, match=r"advantages_P\[0\] has shape \(3,\)"):
        assemble_batch([g], [[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="advantages_P has 2 rows, groups_P has 1"):
        assemble_batch([g], np.zeros((2, 2), np.float32))


def test_empty_trajectory_and_empty_batch_yield_no_datum():
    batch = assemble_batch([_group(Trajectory(transitions=()))], [[0.0]])
    assert batch.num_datums == 0
    check_datum_batch(batch)
    assert assemble_batch([], []).num_datums == 0


@pytest.mark.parametrize(
    ("n", "expected"), [(0, 16), (16, 16), (17, 20), (100, 112), (1024, 1024), (1299, 1536)]
)
def test_bucket_size(n, expected):
    assert bucket_size(n, minimum=16) == expected


def test_bucket_size_bounds_waste_and_counts():
    sizes = {bucket_size(n, minimum=16) for n in range(1, 4097)}
    assert len(sizes) <= 4 * 8 + 1
    for n in range(17, 4097):
        assert n <= bucket_size(n, minimum=16) <= n * 1.25 + 1


@pytest.mark.parametrize(
    ("advantages", "error", "match"),
    [
        ([["1.5"]], TypeError, r"advantages_P\[0\]: expected real numbers"),
        ([[True]], TypeError, r"advantages_P\[0\]: expected real numbers"),
        ([[float("nan")]], ValueError, r"advantages_P\[0\]\[0\]: non-finite advantage nan"),
        ([[1e40]], ValueError, r"non-finite advantage 1e\+40 \(as float32\)"),
        (np.array([[np.inf]]), ValueError, r"advantages_P\[0, 0\]: non-finite"),
    ],
)
def test_bad_advantages_are_refused(advantages, error, match):
    with pytest.raises(error, match=match):
        assemble_batch([_group(_three_turns())], advantages)


def test_batch_arrays_are_read_only():
    batch = assemble_batch([_group(_three_turns())], [[1.0]])
    for field in (
        "input_tokens_D_T",
        "target_tokens_D_T",
        "advantages_D_T",
        "mask_D_T",
        "length_D",
    ):
        with pytest.raises(ValueError, match="read-only"):
            getattr(batch, field)[0, ...] = 1


def _replace(batch, **changes):
    import msgspec

    return msgspec.structs.replace(batch, **changes)


def test_check_datum_batch_enforces_the_padding_contract():
    batch = assemble_batch([_group(_three_turns())], [[1.0]], min_datums=2)
    check_datum_batch(batch)
    length = np.array(batch.length_D)
    length[1] = 5
    with pytest.raises(ValueError, match="padded rows"):
        check_datum_batch(_replace(batch, length_D=length))
    adv = np.array(batch.advantages_D_T)
    adv[0, -1] = 3.0
    with pytest.raises(ValueError, match=r"advantages_D_T: datum 0 has non-zero values beyond"):
        check_datum_batch(_replace(batch, advantages_D_T=adv))
    with pytest.raises(TypeError, match=r"input_tokens_D_T: expected integers"):
        check_datum_batch(_replace(batch, input_tokens_D_T=batch.input_tokens_D_T * 1.5))
    with pytest.raises(ValueError, match=r"num_datums: 3 outside"):
        check_datum_batch(_replace(batch, num_datums=3))
    # At its length a datum's input row may hold its last token (as assemble_batch leaves it)
    # or 0, nothing else.
    wide = assemble_batch([_group(_three_turns())], [[1.0]], min_tokens=32)
    inputs = np.array(wide.input_tokens_D_T)
    at_length = int(wide.length_D[0])
    assert inputs[0, at_length] == wide.target_tokens_D_T[0, at_length - 1]
    inputs[0, at_length] = 0
    check_datum_batch(_replace(wide, input_tokens_D_T=inputs))
    inputs[0, at_length] = 99
    with pytest.raises(ValueError, match=r"input_tokens_D_T: datum 0 holds 99 at its length"):
        check_datum_batch(_replace(wide, input_tokens_D_T=inputs))
    inputs[0, at_length], inputs[0, at_length + 1] = 0, 5
    with pytest.raises(ValueError, match=r"input_tokens_D_T: datum 0 has non-zero values beyond"):
        check_datum_batch(_replace(wide, input_tokens_D_T=inputs))
    inputs[0, at_length + 1] = 0
    inputs[1, 0] = 5  # a padded row (length 0) has no last token to share
    with pytest.raises(ValueError, match=r"input_tokens_D_T: datum 1 has non-zero values beyond"):
        check_datum_batch(_replace(wide, input_tokens_D_T=inputs))
    targets = np.array(batch.target_tokens_D_T)
    targets[0, 0] = -7
    with pytest.raises(ValueError, match=r"target_tokens_D_T: holds negative token ids"):
        check_datum_batch(_replace(batch, target_tokens_D_T=targets), padding=False)
    # Without the padding check, non-zero values beyond a datum's length are accepted...
    check_datum_batch(_replace(batch, advantages_D_T=adv), padding=False)
    # ...but shapes, dtypes and finiteness still are.
    adv[0, 0] = np.nan
    with pytest.raises(ValueError, match=r"advantages_D_T: holds non-finite values"):
        check_datum_batch(_replace(batch, advantages_D_T=adv), padding=False)


def test_provenance_spans_follow_the_cookbook():
    def step(ob, ac, sequence_id):
        return Transition(
            ob=ModelInput.from_ints(ob),
            ac=TokensWithLogprobs(tokens=ac, logprobs=[-1.0] * len(ac), sequence_id=sequence_id),
            reward=0.0,
            episode_done=False,
        )

    traj = Trajectory(transitions=(step(OB1, AC1, "a"), step(OB2, AC2, "b")))
    batch = assemble_batch([_group(traj)], [[1.0]])
    provenance = batch.provenance_D[0]
    assert provenance is not None
    inputs, targets = provenance
    # Full sequence: prompt a[0:5], sampled a[0:3], prompt b[8:10], sampled b[0:2].
    as_tuples = lambda runs: [(r.kind, r.sequence_id, r.offset, r.length) for r in runs]  # noqa: E731
    assert as_tuples(inputs) == [
        ("prompt", "a", 0, 5),
        ("sampled", "a", 0, 3),
        ("prompt", "b", 8, 2),
        ("sampled", "b", 0, 1),
    ]
    assert as_tuples(targets) == [
        ("prompt", "a", 1, 4),
        ("sampled", "a", 0, 3),
        ("prompt", "b", 8, 2),
        ("sampled", "b", 0, 2),
    ]
    # One action without an id: no provenance for the datum, as in the cookbook.
    mixed = Trajectory(transitions=(step(OB1, AC1, "a"), step(OB2, AC2, None)))
    assert assemble_batch([_group(mixed)], [[1.0]]).provenance_D == (None,)


def test_empty_sequence_id_is_refused():
    with pytest.raises(ValueError, match=r"TokensWithLogprobs\.sequence_id: must be non-empty"):
        TokensWithLogprobs(tokens=[1], logprobs=[-1.0], sequence_id="")
