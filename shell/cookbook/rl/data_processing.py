"""The cookbook's `tinker_cookbook.rl.data_processing`: advantages and training datums.

Thin wrappers with the cookbook's signatures over the pure core: `rlpure.advantages`
(`compute_advantages`, `remove_constant_reward_groups`), `rlpure.packing.assemble_batch`
(prefix merging, masks, provenance) and `shell.datums.to_tinker_datums` (`tinker.Datum`s).
`tests/parity/test_rl_data_processing.py`-style checks compare them with the cookbook's on the
same groups.

Conventions and deliberate differences:
- `compute_advantages` returns one float32 numpy array `[G]` per group where the cookbook
  returns `torch.Tensor`s: the project has no torch dependency. Both support `float(a[g])`,
  `len`, iteration and numpy conversion, which is all the cookbook's own callers use;
  `assemble_training_data` accepts either (torch tensors on the CPU included).
- Datums carry `target_tokens` (int64), `logprobs`, `advantages` and `mask` (float32), as the
  cookbook's do; `mask` is not a Tinker loss input, so strip it before `forward_backward` (the
  cookbook's loop does, `shell.training` never sends it).
- `advantages` is float32 in every datum; the cookbook's is int64 in a datum without action
  tokens (it builds it from the ints `[0] * n`), an accident of `torch.tensor` type inference.
- Model inputs are built with the SDK's validating constructor (`chunk.tokens` is a list of
  ints, as in the cookbook's datums).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import tinker

from rlpure import advantages as advantages_lib
from rlpure.packing import assemble_batch
from rlpure.records import Trajectory, TrajectoryGroup
from shell.datums import to_tinker_datums

__all__ = [
    "assemble_training_data",
    "compute_advantages",
    "remove_constant_reward_groups",
    "trajectory_to_data",
]

logger = logging.getLogger(__name__)


def compute_advantages(trajectory_groups_P: Sequence[TrajectoryGroup]) -> list[np.ndarray]:
    """Each trajectory's total reward minus its group's mean (the cookbook's estimator).

    Args:
        trajectory_groups_P: the batch, `P` groups of ragged sizes.

    Returns:
        `P` float32 numpy arrays, array `p` of shape `[G_p]` (the cookbook: torch tensors).
    """
    if not trajectory_groups_P:
        return []
    advantages_P_G = np.asarray(advantages_lib.compute_advantages(trajectory_groups_P))
    return [
        np.array(advantages_P_G[p, : len(group.trajectories_G)], dtype=np.float32)
        for p, group in enumerate(trajectory_groups_P)
    ]


def _datums(
    groups_P: Sequence[TrajectoryGroup], advantages_P: Any, *, include_provenance: bool
) -> tuple[list[tinker.Datum], list[dict[str, int]]]:
    batch = assemble_batch(groups_P, advantages_P, bucket=False, min_datums=1, min_tokens=1)
    if not include_provenance:
        batch = msgspec.structs.replace(batch, provenance_D=())
    data_D = to_tinker_datums(batch, include_mask=True, validated=True)
    metadata_D = [
        {"group_idx": int(p), "traj_idx": int(g)}
        for p, g in zip(
            np.asarray(batch.group_idx_D)[: len(data_D)].tolist(),
            np.asarray(batch.traj_idx_D)[: len(data_D)].tolist(),
            strict=True,
        )
    ]
    return data_D, metadata_D


def trajectory_to_data(
    traj: Trajectory, traj_advantage: float, include_provenance: bool = True
) -> list[tinker.Datum]:
    """The datums of one trajectory: one per run of turns whose observations extend the
    previous observation + action (see `rlpure.packing.trajectory_segments`).

    Args:
        traj: the trajectory.
        traj_advantage: the advantage given to each of its trained action tokens (a turn whose
            `parse_error_masked` metric is >= 1 gets mask and advantage 0).
        include_provenance: attach sampler provenance spans (`Datum.with_provenance`) when
            every action carries a `sequence_id`.

    Returns:
        The datums, in turn order.
    """
    group = TrajectoryGroup(trajectories_G=(traj,), final_rewards_G=(0.0,), metrics_G=({},))
    data_D, _ = _datums([group], [[float(traj_advantage)]], include_provenance=include_provenance)
    return data_D


def assemble_training_data(
    trajectory_groups_P: Sequence[TrajectoryGroup],
    advantages_P: Sequence[Any],
    include_provenance: bool = True,
) -> tuple[list[tinker.Datum], list[dict[str, int]]]:
    """All datums of a batch, group by group and trajectory by trajectory.

    Args:
        trajectory_groups_P: the batch.
        advantages_P: one `[G_p]` advantage sequence per group (numpy arrays, lists or the
            cookbook's torch tensors).
        include_provenance: see `trajectory_to_data`.

    Returns:
        `(data_D, metadata_D)`: the datums and, for each, `{"group_idx": p, "traj_idx": g}`.
    """
    if not trajectory_groups_P:
        if len(advantages_P):
            raise ValueError(
                f"assemble_training_data: {len(advantages_P)} advantage rows for 0 groups"
            )
        return [], []
    return _datums(trajectory_groups_P, list(advantages_P), include_provenance=include_provenance)


def remove_constant_reward_groups(
    trajectory_groups_P: Sequence[TrajectoryGroup],
) -> list[TrajectoryGroup]:
    """The groups whose trajectories' total rewards are not all equal; if every group is
    constant, the first group alone (so the batch is not empty), as the cookbook.

    Args:
        trajectory_groups_P: the batch.

    Returns:
        The kept groups, in order.
    """
    kept = list(advantages_lib.remove_constant_reward_groups(trajectory_groups_P))
    if trajectory_groups_P and len(kept) == 1 and not _mixed(kept[0]):
        logger.warning("All rewards are uniform. There will be no gradient")
    return kept


def _mixed(group: TrajectoryGroup) -> bool:
    totals_G = group.get_total_rewards()
    return any(total != totals_G[0] for total in totals_G)
