"""`shell.cookbook.rl.data_processing` against tinker-cookbook 0.6.1's `rl/data_processing.py`.

The same groups go through both (`shell.to_cookbook.to_cookbook_groups` gives the cookbook's
records): advantages, datums (tokens, every loss input including `mask`, provenance spans),
datum metadata and constant-group removal must agree. Skipped without the cookbook.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from rlpure.testing import batches
from shell.cookbook.rl import data_processing as ours
from shell.to_cookbook import to_cookbook_groups
from tests.parity.porting import require_cookbook


def _cookbook():
    require_cookbook()
    from tinker_cookbook.rl import data_processing

    return data_processing


def _same_datums(mine, theirs) -> None:
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert a.model_input.to_ints() == b.model_input.to_ints()
        assert set(a.loss_fn_inputs) == set(b.loss_fn_inputs)
        for key, td in b.loss_fn_inputs.items():
            if not (key == "advantages" and td.dtype == "int64"):
                # the cookbook's advantages of a datum without action tokens are the ints
                # `[0] * n`, so torch makes them int64; ours stay float32 (documented)
                assert a.loss_fn_inputs[key].dtype == td.dtype, key
            np.testing.assert_array_equal(a.loss_fn_inputs[key].to_numpy(), td.to_numpy())
        assert a.model_input_spans == b.model_input_spans
        assert a.loss_fn_input_spans == b.loss_fn_input_spans


@settings(max_examples=60, deadline=None)
@given(batches(reward_kind="binary", prefix="mixed", masked_turns=True, max_group_size=6))
def test_advantages_datums_and_metadata_match_the_cookbook(groups_P) -> None:
    cookbook = _cookbook()
    groups_P = tuple(g for g in groups_P if g.trajectories_G)
    cb_groups = to_cookbook_groups(groups_P)
    cb_adv = cookbook.compute_advantages(cb_groups)
    my_adv = ours.compute_advantages(groups_P)
    assert [a.dtype for a in my_adv] == [np.float32] * len(my_adv)
    for mine, theirs in zip(my_adv, cb_adv, strict=True):
        np.testing.assert_array_equal(mine, theirs.numpy())
    for include_provenance in (True, False):
        cb_data, cb_meta = cookbook.assemble_training_data(
            cb_groups, cb_adv, include_provenance=include_provenance
        )
        # the cookbook's torch advantages are accepted as they are
        my_data, my_meta = ours.assemble_training_data(
            groups_P, cb_adv, include_provenance=include_provenance
        )
        _same_datums(my_data, cb_data)
        assert my_meta == cb_meta


@settings(max_examples=40, deadline=None)
@given(batches(reward_kind="float", prefix="mixed", masked_turns=True, max_group_size=4))
def test_trajectory_to_data_matches_the_cookbook(groups_P) -> None:
    cookbook = _cookbook()
    for group, cb_group in zip(groups_P, to_cookbook_groups(groups_P), strict=True):
        for traj, cb_traj in zip(group.trajectories_G, cb_group.trajectories_G, strict=True):
            _same_datums(
                ours.trajectory_to_data(traj, 0.25), cookbook.trajectory_to_data(cb_traj, 0.25)
            )


@settings(max_examples=60, deadline=None)
@given(batches(reward_kind="binary", max_group_size=4, max_turns=1))
def test_constant_group_removal_matches_the_cookbook(groups_P) -> None:
    cookbook = _cookbook()
    kept = ours.remove_constant_reward_groups(groups_P)
    cb_kept = cookbook.remove_constant_reward_groups(to_cookbook_groups(groups_P))
    assert isinstance(kept, list)
    assert [g.get_total_rewards() for g in kept] == [g.get_total_rewards() for g in cb_kept]
