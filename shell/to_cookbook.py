"""rlpure records → tinker-cookbook 0.6.1 records, for parity checks and for porting code.

The project does not depend on `tinker-cookbook` (it needs torch). This module imports it only
when called, so `import shell` works without it. Conventions:
- Token ids become Python lists of ints and sampled logprobs lists of floats, as the cookbook's
  records hold them; observations become `tinker.ModelInput.from_ints(...)`.
- Every field the cookbook's `rl/data_processing.py` reads is carried over (rewards, episode
  flags, metrics such as `parse_error_masked`, sampler sequence ids for provenance, final
  observations, group rewards and metrics), so `compute_advantages` + `assemble_training_data`
  on the result is the reference for `rlpure.compute_advantages` + `rlpure.assemble_batch`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import tinker

from rlpure.records import Trajectory, TrajectoryGroup, Transition

__all__ = ["to_cookbook_groups"]

INSTALL_HINT = (
    "pip install --no-deps tinker-cookbook==0.6.1 && pip install torch==2.13.0 chz pillow blobfile"
)


def _cookbook_modules() -> tuple[Any, Any]:
    try:
        types = importlib.import_module("tinker_cookbook.rl.types")
        completers = importlib.import_module("tinker_cookbook.completers")
    except ImportError as error:
        raise ImportError(
            f"to_cookbook_groups needs tinker-cookbook 0.6.1 and torch ({error}); in a throwaway "
            f"venv: {INSTALL_HINT}"
        ) from error
    return types, completers


def to_cookbook_groups(groups_P: Sequence[TrajectoryGroup]) -> list[Any]:
    """The same groups as `tinker_cookbook.rl.types.TrajectoryGroup`s.

    Args:
        groups_P: rlpure groups.

    Returns:
        P cookbook `TrajectoryGroup`s, group and trajectory order preserved.

    Raises:
        ImportError: when tinker-cookbook (or torch, which it imports) is not installed, with
            the install command.
    """
    types, completers = _cookbook_modules()

    def transition(t: Transition) -> Any:
        return types.Transition(
            ob=tinker.ModelInput.from_ints(t.ob.to_ints()),
            ac=completers.TokensWithLogprobs(
                tokens=t.ac.tokens.tolist(),
                maybe_logprobs=None if t.ac.logprobs is None else t.ac.logprobs.tolist(),
                sequence_id=t.ac.sequence_id,
            ),
            reward=t.reward,
            episode_done=t.episode_done,
            metrics=dict(t.metrics),
        )

    def trajectory(traj: Trajectory) -> Any:
        return types.Trajectory(
            transitions=[transition(t) for t in traj.transitions],
            final_ob=tinker.ModelInput.from_ints(traj.final_ob.to_ints()),
        )

    return [
        types.TrajectoryGroup(
            trajectories_G=[trajectory(traj) for traj in group.trajectories_G],
            final_rewards_G=list(group.final_rewards_G),
            metrics_G=[dict(m) for m in group.metrics_G],
        )
        for group in groups_P
    ]
