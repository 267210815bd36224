"""Properties of `assemble_batch` and a differential test against the list-based reference."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.packing import assemble_batch, check_datum_batch, datum_arrays
from rlpure.records import PARSE_ERROR_MASKED_METRIC_KEY, TrajectoryGroup
from rlpure.testing import batches
from rlpure.testing.reference import reference_assemble_training_data


def _per_token(provenance) -> tuple | None:
    """Provenance as one (kind, sequence_id, position) label per token, for inputs and targets.

    Run boundaries may differ between implementations (two adjacent runs of one sequence can be
    one run); the labelling of every token may not.
    """
    if provenance is None:
        return None
    out = []
    for runs in provenance:
        labels: list[tuple[str, str, int]] = []
        for run in runs:
            kind, sequence_id, offset, length = (
                (run.kind, run.sequence_id, run.offset, run.length) if hasattr(run, "kind") else run
            )
            labels.extend((kind, sequence_id, offset + i) for i in range(length))
        out.append(tuple(labels))
    return tuple(out)


ADVANTAGE = st.floats(-4.0, 4.0, allow_nan=False, width=32)


def _advantages_for(
    groups_P: tuple[TrajectoryGroup, ...], data: st.DataObject
) -> list[list[float]]:
    return [[data.draw(ADVANTAGE) for _ in group.trajectories_G] for group in groups_P]


@settings(max_examples=60, deadline=None)
@given(batches(prefix="mixed", masked_turns=True), st.data())
def test_assemble_batch_equals_the_list_reference(groups_P, data):
    advantages_P = _advantages_for(groups_P, data)
    batch = assemble_batch(groups_P, advantages_P)
    check_datum_batch(batch)
    expected = reference_assemble_training_data(groups_P, advantages_P)
    assert batch.num_datums == len(expected)
    for d, ref in enumerate(expected):
        got = datum_arrays(batch, d)
        assert got["input_tokens"].tolist() == ref["model_input"]
        assert got["target_tokens"].tolist() == ref["target_tokens"]
        np.testing.assert_array_equal(got["logprobs"], np.asarray(ref["logprobs"], np.float32))
        np.testing.assert_array_equal(got["advantages"], np.asarray(ref["advantages"], np.float32))
        np.testing.assert_array_equal(got["mask"], np.asarray(ref["mask"], np.float32))
        assert (batch.group_idx_D[d], batch.traj_idx_D[d]) == (ref["group_idx"], ref["traj_idx"])
        assert _per_token(batch.provenance_D[d]) == _per_token(ref["provenance"])


def _dirty_empty(shape, dtype):
    """What `np.empty` may hand back: memory holding stale values (NaN bits everywhere)."""
    return np.full(shape, np.nan, dtype)


@settings(max_examples=40, deadline=None)
@given(batches(prefix="mixed", masked_turns=True), st.data())
def test_uninitialised_output_memory_never_shows(groups_P, data):
    # assemble_batch writes into uninitialised memory; every visible position must be written.
    advantages_P = _advantages_for(groups_P, data)
    clean = assemble_batch(groups_P, advantages_P)
    dirty = assemble_batch(groups_P, advantages_P, _alloc=_dirty_empty)
    check_datum_batch(dirty)
    for name in ("input_tokens_D_T", "target_tokens_D_T", "logprobs_D_T", "advantages_D_T"):
        np.testing.assert_array_equal(getattr(dirty, name), getattr(clean, name), err_msg=name)
    np.testing.assert_array_equal(dirty.mask_D_T, clean.mask_D_T)


@settings(max_examples=40, deadline=None)
@given(batches(prefix="mixed", masked_turns=True), st.data())
def test_datum_invariants(groups_P, data):
    advantages_P = _advantages_for(groups_P, data)
    batch = assemble_batch(groups_P, advantages_P)
    n, (d_pad, t_pad) = batch.num_datums, batch.shape
    lengths = batch.length_D[:n]
    # Mask sum = number of action tokens of unmasked transitions (every datum the strategies
    # make opens with an observation, so every action token is a target).
    unmasked_action_tokens = sum(
        t.ac.tokens.shape[0]
        for g in groups_P
        for traj in g.trajectories_G
        for t in traj.transitions
        if float(t.metrics.get(PARSE_ERROR_MASKED_METRIC_KEY, 0.0)) < 1.0
    )
    assert batch.mask_D_T.sum() == unmasked_action_tokens
    # Shifted views agree: input[i + 1] == target[i] inside each datum.
    for d in range(n):
        length = lengths[d]
        np.testing.assert_array_equal(
            batch.input_tokens_D_T[d, 1:length], batch.target_tokens_D_T[d, : length - 1]
        )
        adv_d = np.asarray(advantages_P[batch.group_idx_D[d]][batch.traj_idx_D[d]], np.float32)
        mask_d = batch.mask_D_T[d, :length]
        np.testing.assert_array_equal(batch.advantages_D_T[d, :length], mask_d * adv_d)
        assert set(np.unique(mask_d).tolist()) <= {0.0, 1.0}
    # Padding never leaks: everything beyond a datum's length and every padded row is zero,
    # except that the inputs hold the datum's last token at its length (inputs and targets are
    # two views of one buffer of full sequences).
    cols = np.arange(t_pad)[None, :]
    outside = cols >= batch.length_D[:, None]
    for field in ("target_tokens_D_T", "logprobs_D_T", "advantages_D_T", "mask_D_T"):
        assert not np.asarray(getattr(batch, field))[outside].any(), field
    inputs = np.array(batch.input_tokens_D_T)
    for d in range(n):
        if lengths[d] < t_pad:
            assert inputs[d, lengths[d]] == batch.target_tokens_D_T[d, lengths[d] - 1]
            inputs[d, lengths[d]] = 0
    assert not inputs[outside].any()
    assert (batch.length_D[n:] == 0).all() and (batch.group_idx_D[n:] == -1).all()
    assert d_pad >= n and t_pad >= (lengths.max() if n else 0)


@settings(max_examples=60, deadline=None)
@given(batches(prefix="always", masked_turns=False, min_group_size=1))
def test_prefix_trajectories_make_one_datum_each_with_exact_mask_count(groups_P):
    advantages_P = [[1.0] * len(g.trajectories_G) for g in groups_P]
    batch = assemble_batch(groups_P, advantages_P)
    trajs = [traj for g in groups_P for traj in g.trajectories_G if traj.transitions]
    assert batch.num_datums == len(trajs)
    # Every datum opens with an observation of >= 2 tokens, so every action token is a target.
    action_tokens = sum(t.ac.tokens.shape[0] for traj in trajs for t in traj.transitions)
    assert batch.mask_D_T.sum() == action_tokens


def test_jitted_consumer_does_not_retrace_within_a_bucket():
    from rlpure.records import ModelInput, TokensWithLogprobs, Trajectory, Transition

    traces = []

    @jax.jit
    def weighted_sum(batch):
        traces.append(batch.shape)
        return jnp.sum(batch.advantages_D_T * batch.logprobs_D_T * batch.mask_D_T)

    def group(*n_acs: int) -> TrajectoryGroup:
        trajs = tuple(
            Trajectory(
                transitions=(
                    Transition(
                        ob=ModelInput.from_ints([1, 2, 3]),
                        ac=TokensWithLogprobs(tokens=[5] * n, logprobs=[-1.0] * n),
                        reward=1.0,
                        episode_done=True,
                    ),
                )
            )
            for n in n_acs
        )
        n = len(trajs)
        return TrajectoryGroup(
            trajectories_G=trajs, final_rewards_G=(0.0,) * n, metrics_G=({},) * n
        )

    first = assemble_batch([group(100)], [[1.0]])
    second = assemble_batch([group(107, 101)], [[1.0, 1.0]])  # new length AND a new datum count
    assert first.shape == second.shape  # 102..109 tokens share the 112 bucket, 1..2 datums the 1..2
    assert first.num_datums != second.num_datums
    assert float(weighted_sum(first)) == -100.0
    assert float(weighted_sum(second)) == -208.0
    assert len(traces) == 1
