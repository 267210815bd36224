"""`shell.to_cookbook.to_cookbook_groups`: a clear error without the cookbook; fields carried over."""

import importlib.util

import pytest

from rlpure.records import ModelInput, TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition
from shell.to_cookbook import to_cookbook_groups

HAVE_COOKBOOK = importlib.util.find_spec("tinker_cookbook") is not None


def _group() -> TrajectoryGroup:
    step = Transition(
        ob=ModelInput.from_ints([1, 2]),
        ac=TokensWithLogprobs(tokens=[3, 4], logprobs=[-0.5, -0.25], sequence_id="s0"),
        reward=1.0,
        episode_done=True,
        metrics={"parse_error_masked": 1.0},
    )
    traj = Trajectory(transitions=(step,), final_ob=ModelInput.from_ints([9]))
    return TrajectoryGroup(trajectories_G=(traj,), final_rewards_G=(0.5,), metrics_G=({"k": 2.0},))


@pytest.mark.skipif(HAVE_COOKBOOK, reason="tinker-cookbook is installed here")
def test_without_the_cookbook_the_error_says_how_to_install_it():
    with pytest.raises(ImportError, match=r"tinker-cookbook 0\.6\.1.*pip install"):
        to_cookbook_groups([_group()])


@pytest.mark.skipif(not HAVE_COOKBOOK, reason="needs tinker-cookbook (see test_cookbook_parity)")
def test_every_field_the_cookbook_reads_is_carried_over():
    (group,) = to_cookbook_groups([_group()])
    (traj,) = group.trajectories_G
    (step,) = traj.transitions
    assert step.ob.to_ints() == [1, 2]
    assert step.ac.tokens == [3, 4]
    assert step.ac.maybe_logprobs == [-0.5, -0.25]
    assert step.ac.sequence_id == "s0"
    assert (step.reward, step.episode_done) == (1.0, True)
    assert step.metrics == {"parse_error_masked": 1.0}
    assert traj.final_ob.to_ints() == [9]
    assert group.final_rewards_G == [0.5]
    assert group.metrics_G == [{"k": 2.0}]
    assert group.get_total_rewards() == [1.5]
