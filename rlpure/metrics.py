"""RL training metrics, pure, with tinker-cookbook's names so dashboards carry over.

Conventions:
- Every function returns a plain `dict[str, float]` (Python floats, JSON-serialisable), keyed
  exactly as the cookbook logs them: `env/all/...` and `env/<tag>/...` from
  `rl/metric_util.compute_trajectory_metrics`, `optim/...` from `rl/metrics.
  compute_kl_sample_train`, `sampling_client/...` / `time/...` from
  `compute_sampling_client_metrics`, `rollout_errors/...` from `RolloutErrorCounter`.
- Record metrics (`trajectory_metrics`) are host-side Python over `TrajectoryGroup` records
  (they are counting and averaging over ragged records, not array maths). Token metrics
  (`kl_sample_train_metrics`) are `jax.numpy` over padded `[D, T]` arrays aligned with the
  targets, with `mask_D_T` (> 0 on action tokens) selecting the positions; values off the
  mask are never read (they may be garbage, even NaN).
- Means of per-transition / per-trajectory metric keys follow the cookbook's `dict_mean`: a key
  is averaged over the records that carry it (missing is not zero).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from rlpure._checks import check_shapes_equal
from rlpure.records import TrajectoryGroup

__all__ = [
    "kl_sample_train_metrics",
    "rollout_error_metrics",
    "sampling_client_metrics",
    "trajectory_metrics",
]


def _mean_by_key(dicts: Sequence[dict[str, float | int]]) -> dict[str, float]:
    """The cookbook's `dict_mean`: each key averaged over the dicts that carry it."""
    values_by_key: dict[str, list[float | int]] = {}
    for metrics in dicts:
        for key, value in metrics.items():
            values_by_key.setdefault(key, []).append(value)
    return {key: float(np.mean(values)) for key, values in values_by_key.items()}


def _by_group_metrics(
    groups_P: Sequence[TrajectoryGroup], good_threshold: float
) -> dict[str, float]:
    """Fractions of groups whose total rewards are mixed, all equal and good, all equal and bad."""
    if not groups_P:
        return {
            "by_group/frac_mixed": 0.0,
            "by_group/frac_all_good": 0.0,
            "by_group/frac_all_bad": 0.0,
        }
    mixed = good = bad = 0
    for group in groups_P:
        rewards_G = group.get_total_rewards()
        if all(r == rewards_G[0] for r in rewards_G):
            # An empty group (the cookbook would raise IndexError on it) counts as all bad.
            if rewards_G and rewards_G[0] >= good_threshold:
                good += 1
            else:
                bad += 1
        else:
            mixed += 1
    n = len(groups_P)
    return {
        "by_group/frac_mixed": mixed / n,
        "by_group/frac_all_good": good / n,
        "by_group/frac_all_bad": bad / n,
    }


def _metrics_of(groups_P: Sequence[TrajectoryGroup], good_threshold: float) -> dict[str, float]:
    trajectories = [traj for group in groups_P for traj in group.trajectories_G]
    transitions = [tr for traj in trajectories for tr in traj.transitions]
    total_turns = len(transitions)
    total_episodes = len(trajectories)
    total_ac_tokens = sum(int(tr.ac.tokens.shape[0]) for tr in transitions)
    total_ob_tokens = sum(tr.ob.length for tr in transitions)
    metrics: dict[str, float] = {
        "ac_tokens_per_turn": total_ac_tokens / total_turns if total_turns else 0.0,
        "ob_tokens_per_turn": total_ob_tokens / total_turns if total_turns else 0.0,
        "turns_per_episode": total_turns / total_episodes if total_episodes else 0.0,
        "total_episodes": float(total_episodes),
        "total_turns": float(total_turns),
        "total_ac_tokens": float(total_ac_tokens),
        "total_ob_tokens": float(total_ob_tokens),
        # prompt tokens the sampler reported as prefix-cache hits (a part of total_ob_tokens)
        "total_cached_ob_tokens": float(sum(tr.ac.prompt_cache_hit_tokens for tr in transitions)),
    }
    rewards = [reward for group in groups_P for reward in group.get_total_rewards()]
    metrics["reward/total"] = float(np.mean(rewards)) if rewards else 0.0
    # Per-transition and per-trajectory (group-reward) metrics share keys on purpose: an env may
    # report e.g. `format` per step while another reports it from compute_group_rewards.
    group_metrics = [m for group in groups_P for m in group.metrics_G]
    metrics.update(_mean_by_key([tr.metrics for tr in transitions] + group_metrics))
    metrics.update(_by_group_metrics(groups_P, good_threshold))
    return metrics


def trajectory_metrics(
    groups_P: Sequence[TrajectoryGroup],
    tags_P: Sequence[Sequence[str]] | None = None,
    *,
    good_threshold: float = 0.5,
) -> dict[str, float]:
    """Rollout metrics over a batch of groups, named as the cookbook's
    `compute_trajectory_metrics`.

    Under `env/all/` (and, when tags are given and at least one tag selects a strict subset of
    the groups, also under `env/<tag>/` for every tag, over the groups carrying it):
    `ac_tokens_per_turn`, `ob_tokens_per_turn`, `turns_per_episode`, `total_episodes`,
    `total_turns`, `total_ac_tokens`, `total_ob_tokens`, `total_cached_ob_tokens` (the part of
    the prompt tokens the sampler reported as prefix-cache hits, `ac.prompt_cache_hit_tokens`),
    `reward/total` (mean over trajectories
    of step rewards + final group reward), the mean of every transition-metric and group-metric
    key (e.g. `format`, `correct`), and `by_group/frac_mixed`, `by_group/frac_all_good`,
    `by_group/frac_all_bad` (a group is "all good" when every trajectory's total reward is
    equal and `>= good_threshold`).

    Args:
        groups_P: one `TrajectoryGroup` per problem.
        tags_P: optional logging tags per group (the cookbook's `EnvGroupBuilder.logging_tags`),
            aligned with `groups_P`. A tag repeated within one group's list counts once.
        good_threshold: reward at or above which an all-equal group is "good" (cookbook 0.5).

    Returns:
        `dict[str, float]`, JSON-serialisable.

    Raises:
        ValueError: `tags_P` does not have one entry per group.

    Examples:
        >>> from rlpure.records import ModelInput, TokensWithLogprobs, Trajectory, Transition
        >>> step = Transition(ob=ModelInput.from_ints([1, 2]),
        ...                   ac=TokensWithLogprobs(tokens=[3]), reward=0.0, episode_done=True)
        >>> group = TrajectoryGroup(trajectories_G=(Trajectory(transitions=(step,)),) * 2,
        ...                         final_rewards_G=(1.0, 0.0), metrics_G=({}, {}))
        >>> m = trajectory_metrics([group])
        >>> m["env/all/reward/total"], m["env/all/by_group/frac_mixed"]
        (0.5, 1.0)
    """
    if tags_P is not None and len(tags_P) != len(groups_P):
        raise ValueError(
            f"trajectory_metrics: tags_P has {len(tags_P)} entries, groups_P has "
            f"{len(groups_P)}; they must be equal"
        )
    out: dict[str, float] = {}
    if tags_P is not None:
        groups_by_tag: dict[str, list[TrajectoryGroup]] = defaultdict(list)
        for tags, group in zip(tags_P, groups_P, strict=True):
            if isinstance(tags, str):
                raise TypeError("trajectory_metrics: tags_P[i] must be a sequence of str, not str")
            for tag in dict.fromkeys(tags):
                groups_by_tag[tag].append(group)
        if any(len(groups) < len(groups_P) for groups in groups_by_tag.values()):
            for tag, groups in groups_by_tag.items():
                for key, value in _metrics_of(groups, good_threshold).items():
                    out[f"env/{tag}/{key}"] = value
    for key, value in _metrics_of(groups_P, good_threshold).items():
        out[f"env/all/{key}"] = value
    return out


@jax.jit
def _kl_sample_train_sums(
    sampling_logprobs_D_T: jax.Array, training_logprobs_D_T: jax.Array, mask_D_T: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    on = mask_D_T > 0
    q = jnp.where(on, sampling_logprobs_D_T, 0).astype(jnp.float32)
    lp = jnp.where(on, training_logprobs_D_T, 0).astype(jnp.float32)
    diff = q - lp
    return jnp.sum(on), jnp.sum(diff), jnp.sum(jnp.square(diff)), jnp.sum(q)


def kl_sample_train_metrics(
    sampling_logprobs_D_T: ArrayLike,
    training_logprobs_D_T: ArrayLike,
    mask_D_T: ArrayLike,
) -> dict[str, float]:
    """Sampler-vs-learner divergence and sampling entropy over action tokens.

    With `q` = sampling and `lp` = training logprobs over the `N` positions where
    `mask_D_T > 0`: `optim/kl_sample_train_v1 = mean(q − lp)`,
    `optim/kl_sample_train_v2 = ½·mean((q − lp)²)`, `optim/entropy = −mean(q)` (the
    cookbook's `compute_kl_sample_train`).

    Args:
        sampling_logprobs_D_T: float `[D, T]` logprobs at sampling time (the batch's
            `logprobs_D_T`).
        training_logprobs_D_T: float `[D, T]` learner logprobs from the forward pass (Tinker's
            `loss_fn_outputs["logprobs"]`, padded like the batch).
        mask_D_T: float/bool `[D, T]`, > 0 on action tokens.

    Returns:
        `dict[str, float]` with the three keys above.

    Raises:
        ValueError: `training_logprobs_D_T` or `mask_D_T` has another shape than
            `sampling_logprobs_D_T` (naming both), or no position has `mask_D_T > 0` (the
            cookbook asserts).

    Examples:
        >>> m = kl_sample_train_metrics(jnp.array([[-1.0, -2.0]]), jnp.array([[-1.5, -1.0]]),
        ...                             jnp.array([[1.0, 1.0]]))
        >>> m["optim/kl_sample_train_v1"], m["optim/kl_sample_train_v2"], m["optim/entropy"]
        (-0.25, 0.3125, 1.5)
    """
    check_shapes_equal(
        "kl_sample_train_metrics",
        ("sampling_logprobs_D_T", sampling_logprobs_D_T),
        ("training_logprobs_D_T", training_logprobs_D_T),
        ("mask_D_T", mask_D_T),
    )
    count, diff_sum, diff_sq_sum, q_sum = _kl_sample_train_sums(
        jnp.asarray(sampling_logprobs_D_T),
        jnp.asarray(training_logprobs_D_T),
        jnp.asarray(mask_D_T),
    )
    n = int(count)
    if n == 0:
        raise ValueError("kl_sample_train_metrics: no action tokens (mask_D_T > 0 nowhere)")
    return {
        "optim/kl_sample_train_v1": float(diff_sum) / n,
        "optim/kl_sample_train_v2": 0.5 * float(diff_sq_sum) / n,
        "optim/entropy": -float(q_sum) / n,
    }


def sampling_client_metrics(
    sampling_client_steps_P: Sequence[int], sampling_times_P: Sequence[float]
) -> dict[str, float]:
    """Staleness and sampling time of the groups in a batch (async / off-policy training).

    Keys as the cookbook's `compute_sampling_client_metrics`: `sampling_client/step_{max,min,
    mean}` over the training step of the sampler that produced each group, and
    `time/sampling_time_{max,min,mean}` over each group's sampling time in seconds. Empty input
    gives `{}`.

    Raises:
        ValueError: the two sequences differ in length.

    Examples:
        >>> sampling_client_metrics([3, 5], [1.0, 2.0])["sampling_client/step_mean"]
        4.0
    """
    if len(sampling_client_steps_P) != len(sampling_times_P):
        raise ValueError(
            f"sampling_client_metrics: {len(sampling_client_steps_P)} steps but "
            f"{len(sampling_times_P)} times; they must be equal"
        )
    if not sampling_client_steps_P:
        return {}
    steps = [float(s) for s in sampling_client_steps_P]
    times = [float(t) for t in sampling_times_P]
    return {
        "sampling_client/step_max": max(steps),
        "sampling_client/step_min": min(steps),
        "sampling_client/step_mean": sum(steps) / len(steps),
        "time/sampling_time_max": max(times),
        "time/sampling_time_min": min(times),
        "time/sampling_time_mean": sum(times) / len(times),
    }


def rollout_error_metrics(
    groups_P: Sequence[TrajectoryGroup],
    *,
    groups_skipped: int = 0,
    prefix: str = "rollout_errors",
) -> dict[str, float]:
    """Counts of rollout errors captured on the groups, as the cookbook's
    `RolloutErrorCounter.get_metrics` names them.

    `{prefix}/{error_type}` per error class, `{prefix}/total` and `{prefix}/groups_skipped`;
    `{}` when there is nothing to report. Unlike the cookbook's counter these are the counts of
    this call's groups, not running totals (accumulating across steps is the caller's state).

    Examples:
        >>> from rlpure.records import RolloutError
        >>> g = TrajectoryGroup(trajectories_G=(), final_rewards_G=(), metrics_G=(),
        ...                     rollout_errors=(RolloutError(error_type="TimeoutError",
        ...                                                  error_message="slow"),))
        >>> rollout_error_metrics([g])
        {'rollout_errors/TimeoutError': 1.0, 'rollout_errors/total': 1.0, 'rollout_errors/groups_skipped': 0.0}
    """
    if (
        isinstance(groups_skipped, bool)
        or not isinstance(groups_skipped, int)
        or groups_skipped < 0
    ):
        raise ValueError(
            f"rollout_error_metrics: groups_skipped must be an int >= 0, got {groups_skipped!r}"
        )
    counts = Counter(err.error_type for group in groups_P for err in group.rollout_errors)
    if not counts and groups_skipped == 0:
        return {}
    out = {f"{prefix}/{error_type}": float(n) for error_type, n in counts.items()}
    out[f"{prefix}/total"] = float(sum(counts.values()))
    out[f"{prefix}/groups_skipped"] = float(groups_skipped)
    return out
