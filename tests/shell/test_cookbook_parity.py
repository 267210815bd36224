"""Parity with the real tinker-cookbook 0.6.1 (`rl/data_processing.py`).

The project does not depend on the cookbook (it needs torch); this module is skipped unless
`tinker_cookbook` is importable. To run it: `make parity` (builds ./.cbvenv), or by hand:

    python3 -m venv /tmp/cb && /tmp/cb/bin/pip install --no-deps tinker-cookbook==0.6.1
    /tmp/cb/bin/pip install tinker==0.38.0 torch==2.13.0 chz pillow blobfile datasets \
        jax msgspec optax returns pytest hypothesis rich matplotlib
    /tmp/cb/bin/pip install --no-deps -e . && /tmp/cb/bin/pytest tests/test_cookbook_parity.py
"""

import numpy as np
import pytest
from hypothesis import given, settings

from rlpure.advantages import compute_advantages
from rlpure.packing import assemble_batch
from rlpure.testing import batches
from shell.datums import to_tinker_datums
from shell.to_cookbook import to_cookbook_groups

cookbook = pytest.importorskip("tinker_cookbook.rl.data_processing")


def _check_parity(groups_P, *, exact_advantages: bool):
    cb_groups = to_cookbook_groups(groups_P)
    cb_advantages = cookbook.compute_advantages(cb_groups)
    cb_data, cb_meta = cookbook.assemble_training_data(cb_groups, cb_advantages)

    advantages_P_G = np.asarray(compute_advantages(groups_P))
    for p, adv_G in enumerate(cb_advantages):
        ours = advantages_P_G[p, : len(adv_G)]
        if exact_advantages:
            np.testing.assert_array_equal(ours, adv_G.numpy())
        else:
            # Float rewards: the group mean is a float32 sum whose order differs (torch's
            # vectorised order depends on the CPU: AVX2 and AVX-512 differ), so the mean may
            # differ by an ulp of the sum. That error is relative to the rewards' magnitude,
            # not to A = R - mean, which can be small by cancellation.
            scale = max(1.0, float(np.abs(groups_P[p].get_total_rewards()).max()))
            np.testing.assert_allclose(ours, adv_G.numpy(), rtol=1e-6, atol=1e-6 * scale)
    # Datums from the cookbook's own advantages, so token arrays compare exactly.
    batch = assemble_batch(groups_P, [a.numpy() for a in cb_advantages])
    datums = to_tinker_datums(batch)
    assert len(datums) == len(cb_data)
    for d, (mine, theirs) in enumerate(zip(datums, cb_data, strict=True)):
        assert mine.model_input.to_ints() == theirs.model_input.to_ints()
        assert set(mine.loss_fn_inputs) == set(theirs.loss_fn_inputs)
        for key, td in theirs.loss_fn_inputs.items():
            np.testing.assert_array_equal(mine.loss_fn_inputs[key].to_numpy(), td.to_numpy())
        assert mine.model_input_spans == theirs.model_input_spans
        assert mine.loss_fn_input_spans == theirs.loss_fn_input_spans
        assert (int(batch.group_idx_D[d]), int(batch.traj_idx_D[d])) == (
            cb_meta[d]["group_idx"],
            cb_meta[d]["traj_idx"],
        )


@settings(max_examples=300, deadline=None)
@given(batches(reward_kind="binary", prefix="mixed", masked_turns=True, max_group_size=8))
def test_binary_rewards_match_the_cookbook_exactly(groups_P):
    groups_P = tuple(g for g in groups_P if g.trajectories_G)
    _check_parity(groups_P, exact_advantages=True)


@settings(max_examples=150, deadline=None)
@given(batches(reward_kind="float", prefix="mixed", masked_turns=True, max_group_size=8))
def test_float_rewards_match_the_cookbook_within_1e6(groups_P):
    groups_P = tuple(g for g in groups_P if g.trajectories_G)
    _check_parity(groups_P, exact_advantages=False)
