"""Advantage estimators for grouped rollouts, vectorised over the whole batch.

Conventions:
- Rewards of a batch of `P` groups (problems) with ragged group sizes `G_p` are packed host-side
  (`pack_rewards`) into a padded float32 `rewards_P_G` plus a bool `valid_P_G`; entry `[p, g]` is
  the total reward of trajectory `g` of group `p` (sum of its step rewards plus its final group
  reward, the cookbook's `TrajectoryGroup.get_total_rewards()`), valid entries are left-aligned.
- Both axes are padded to buckets (powers of two, at least `MIN_GROUPS_BUCKET` and
  `MIN_GROUP_SIZE_BUCKET`), so a run compiles each estimator a handful of times, not per step.
- Every estimator is a pure, jitted `jax.numpy` function `(rewards_P_G, valid_P_G) ->
  advantages_P_G` that computes ONE call for the whole batch and returns 0.0 at every invalid
  (padding) entry. Padding never influences valid entries. Each checks at trace time that
  `valid_P_G` has the `[P, G]` shape of `rewards_P_G` (a `ValueError` naming both, never a
  broadcast); the aggregations check `mask_D_T` against `advantages_D_T` the same way.
- A group of one always gets advantage 0 (there is no baseline to compare against).
- Numerics: float32 throughout, like the cookbook (`torch.tensor(rewards_G)` is float32). The
  default estimator, group centring, computes `R - (sum_g R) / G` with one float32 sum, one
  float32 division and one float32 subtraction per entry. Whenever the float32 group sum is exact
  (e.g. 0/1 or small-integer rewards) this equals the cookbook's `t - t.mean()` bit for bit: on
  CPU torch's `mean` is `sum(...).div_(numel)` (a float32 sum, exact here, then an IEEE float32
  division), and IEEE division and subtraction are correctly rounded everywhere. Otherwise
  summation order may differ, and results agree to float32 rounding of the sum. For the same
  reason the padded shape (bucket) can change the last bits of results on inexact sums (XLA may
  reduce a longer row in a different order), never on exact ones; padding VALUES never matter.
- Shift invariance of centring (`R + k` gives the same advantages) is exact only when the group
  mean is exactly representable before and after the shift (e.g. power-of-two group sizes with
  integer rewards); otherwise `fl((S + kG) / G) - k != fl(S / G)` in the last bits — the
  cookbook's float32 formula behaves identically.
- Loss aggregation: Tinker's losses SUM over tokens and datums. Other aggregations (per-sequence
  token mean, DAPO's batch token mean, Dr. GRPO's constant-length normalisation) are expressed by
  rescaling the per-token advantages of a `DatumBatch` (`aggregate_advantages`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal, get_args

import jax
import jax.numpy as jnp
import msgspec
import numpy as np

from rlpure._checks import check_rank, check_shapes_equal
from rlpure.buckets import bucket_size
from rlpure.packing import DatumBatch
from rlpure.records import TrajectoryGroup

__all__ = [
    "MIN_GROUPS_BUCKET",
    "MIN_GROUP_SIZE_BUCKET",
    "AggregationMode",
    "Estimator",
    "PackedRewards",
    "aggregate_advantages",
    "aggregate_batch_token_mean",
    "aggregate_constant_length",
    "aggregate_sequence_token_mean",
    "aggregate_token_sum",
    "compute_advantages",
    "constant_reward_group_mask",
    "group_centered_advantages",
    "group_normalized_advantages",
    "leave_one_out_advantages",
    "pack_rewards",
    "remove_constant_reward_groups",
]

Estimator = Literal["group_centered", "group_normalized", "batch_normalized", "leave_one_out"]
AggregationMode = Literal["token_sum", "sequence_token_mean", "batch_token_mean", "constant_length"]

MIN_GROUPS_BUCKET = 8
"""Smallest padded number of groups `P` (then powers of two)."""
MIN_GROUP_SIZE_BUCKET = 4
"""Smallest padded group size `G` (then powers of two)."""


def _bucket(n: int, minimum: int) -> int:
    """The smallest power of two that is >= max(n, minimum) (`minimum` a power of two)."""
    return bucket_size(n, minimum=minimum, steps_per_octave=1)


# --- host side: ragged groups -> padded arrays -------------------------------------------------


class PackedRewards(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """Total rewards of a batch of groups, padded to bucketed `[P, G]`.

    Attributes:
        rewards_P_G: float32 `[P, G]` total reward of trajectory `g` of group `p`
            (`float32(sum of step rewards + final reward)`, summed in Python float64 as the
            cookbook does); 0.0 at padding.
        valid_P_G: bool `[P, G]` True on the `group_size_P[p]` left-most entries of real rows.
        group_size_P: int32 `[P]` number of trajectories of each group (0 for padded rows).
        num_groups: the real number of groups (rows `>= num_groups` are padding). Static.
        max_group_size: the largest real group size (columns beyond it are padding). Static.
    """

    rewards_P_G: np.ndarray | jax.Array
    valid_P_G: np.ndarray | jax.Array
    group_size_P: np.ndarray | jax.Array
    num_groups: int
    max_group_size: int


jax.tree_util.register_dataclass(
    PackedRewards,
    data_fields=["rewards_P_G", "valid_P_G", "group_size_P"],
    meta_fields=["num_groups", "max_group_size"],
)


def pack_rewards(groups_P: Sequence[TrajectoryGroup]) -> PackedRewards:
    """Packs the total rewards of ragged groups into padded, bucketed arrays (host-side numpy).

    Each total is `get_total_rewards()[g]`: Python's left-to-right float64 sum of the step
    rewards plus the final group reward, then cast to float32 with round-to-nearest-even —
    exactly what `torch.tensor(traj_group.get_total_rewards())` does in the cookbook.

    Args:
        groups_P: the batch, `P` groups of any sizes (a group of one, or even of zero, is fine).

    Returns:
        A `PackedRewards` with `P` and `G` rounded up to buckets.

    Raises:
        TypeError: if an element of `groups_P` is not a `TrajectoryGroup`.

    Examples:
        >>> from rlpure.records import Trajectory
        >>> g = TrajectoryGroup(trajectories_G=(Trajectory(transitions=()),) * 3,
        ...                     final_rewards_G=(1.0, 0.0, 1.0), metrics_G=({},) * 3)
        >>> packed = pack_rewards([g])
        >>> packed.rewards_P_G.shape, packed.num_groups, packed.max_group_size
        ((8, 4), 1, 3)
        >>> packed.rewards_P_G[0].tolist()
        [1.0, 0.0, 1.0, 0.0]
    """
    totals_P: list[list[float]] = []
    for p, group in enumerate(groups_P):
        if not isinstance(group, TrajectoryGroup):
            raise TypeError(
                f"pack_rewards: groups_P[{p}]: expected TrajectoryGroup, got {type(group).__name__}"
            )
        totals_P.append(group.get_total_rewards())
    num_groups = len(totals_P)
    group_size_real = np.fromiter((len(t) for t in totals_P), dtype=np.int32, count=num_groups)
    max_group_size = int(group_size_real.max()) if num_groups else 0
    padded_p = _bucket(num_groups, MIN_GROUPS_BUCKET)
    padded_g = _bucket(max_group_size, MIN_GROUP_SIZE_BUCKET)
    group_size_P = np.zeros(padded_p, np.int32)
    group_size_P[:num_groups] = group_size_real
    valid_P_G = np.arange(padded_g, dtype=np.int32)[None, :] < group_size_P[:, None]
    rewards_P_G = np.zeros((padded_p, padded_g), np.float32)
    flat = [r for totals_G in totals_P for r in totals_G]
    # float64 -> float32 elementwise, round-to-nearest-even (as torch.tensor(list) does);
    # boolean-mask assignment fills row-major, i.e. group by group in input order.
    rewards_P_G[valid_P_G] = np.asarray(flat, dtype=np.float64).astype(np.float32)
    for array in (rewards_P_G, valid_P_G, group_size_P):
        array.flags.writeable = False
    return PackedRewards(
        rewards_P_G=rewards_P_G,
        valid_P_G=valid_P_G,
        group_size_P=group_size_P,
        num_groups=num_groups,
        max_group_size=max_group_size,
    )


# --- estimators on padded arrays (pure, jitted) ------------------------------------------------


def _check_rewards(function: str, rewards_P_G: jax.Array, valid_P_G: jax.Array) -> None:
    """Both `[P, G]` and of one shape; shapes are static, so this runs once per trace."""
    check_rank(function, "rewards_P_G", rewards_P_G, "PG")
    check_shapes_equal(function, ("rewards_P_G", rewards_P_G), ("valid_P_G", valid_P_G))


def _group_sums(rewards_P_G: jax.Array, valid_P_G: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Masked float32 sum and count of each row, `[P, 1]` each (count as float32)."""
    masked_P_G = jnp.where(valid_P_G, rewards_P_G, 0.0)
    sum_P_1 = jnp.sum(masked_P_G, axis=1, keepdims=True)
    count_P_1 = jnp.sum(valid_P_G, axis=1, keepdims=True).astype(jnp.float32)
    return sum_P_1, count_P_1


def _constant_rows(rewards_P_G: jax.Array, valid_P_G: jax.Array) -> jax.Array:
    """bool `[P]`: all valid entries of the row are equal (vacuously True for empty rows)."""
    high_P = jnp.max(jnp.where(valid_P_G, rewards_P_G, -jnp.inf), axis=1)
    low_P = jnp.min(jnp.where(valid_P_G, rewards_P_G, jnp.inf), axis=1)
    return (high_P == low_P) | ~jnp.any(valid_P_G, axis=1)


def _centered(rewards_P_G: jax.Array, valid_P_G: jax.Array) -> jax.Array:
    sum_P_1, count_P_1 = _group_sums(rewards_P_G, valid_P_G)
    mean_P_1 = sum_P_1 / jnp.maximum(count_P_1, 1.0)
    return jnp.where(valid_P_G, rewards_P_G - mean_P_1, 0.0)


@jax.jit
def group_centered_advantages(rewards_P_G: jax.Array, valid_P_G: jax.Array) -> jax.Array:
    """Group-centred advantages (the cookbook's and GRPO's baseline without std scaling).

    `A[p, g] = R[p, g] - (1 / G_p) * sum_{g'} R[p, g']` over the valid entries of row `p`,
    computed as float32 sum, float32 division by `G_p`, float32 subtraction — bit-equal to the
    cookbook's `t - t.mean()` whenever the float32 group sum is exact (see module docstring).
    A group of one gets exactly 0; padding gets 0.

    Args:
        rewards_P_G: float32 `[P, G]` total rewards (anything at padding).
        valid_P_G: bool `[P, G]` True on real entries.

    Returns:
        float32 `[P, G]` advantages, 0.0 where `valid_P_G` is False.

    Raises:
        ValueError: `rewards_P_G` is not `[P, G]`, or `valid_P_G` has another shape.

    Examples:
        >>> import numpy as np
        >>> r = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]], np.float32)
        >>> v = np.array([[True] * 4, [True, True, False, False]])
        >>> group_centered_advantages(r, v).tolist()
        [[0.5, -0.5, -0.5, 0.5], [0.5, -0.5, 0.0, 0.0]]
    """
    _check_rewards("group_centered_advantages", rewards_P_G, valid_P_G)
    return _centered(rewards_P_G, valid_P_G)


@functools.partial(jax.jit, static_argnames=("scope",))
def group_normalized_advantages(
    rewards_P_G: jax.Array,
    valid_P_G: jax.Array,
    *,
    eps: float | jax.Array = 1e-6,
    scope: Literal["group", "batch"] = "group",
    ddof: int | jax.Array = 0,
) -> jax.Array:
    """Centred advantages divided by a standard deviation: GRPO's normalisation and variants.

    `A[p, g] = (R[p, g] - mean_p(R)) / (std + eps)` where the mean is always the group's and

    - `scope="group"` (GRPO, Shao et al. 2024, arXiv:2402.03300): `std = std_p(R)`, the
      standard deviation of the group's own rewards;
    - `scope="batch"` ("group mean, batch std", Liu et al. 2025, arXiv:2508.08221):
      `std = std(R)` over every valid reward of the batch (one scalar).

    `std = sqrt(sum (R - mean)^2 / (n - ddof))`, with the mean and `n` of the same scope:
    `ddof=0` (default) is the population std (numpy's default); `ddof=1` is the sample std
    (torch's `Tensor.std()` default, as in TRL's GRPO). When `n - ddof <= 0` the std is taken
    as 0. Constant groups (all rewards equal, groups of one included) get advantage exactly 0,
    also when their float32 centred values are a few ulps off 0. Where `std + eps == 0` the
    advantage is 0. Padding gets 0.

    Args:
        rewards_P_G: float32 `[P, G]` total rewards.
        valid_P_G: bool `[P, G]` True on real entries.
        eps: added to the std before dividing (traced: changing it does not recompile).
        scope: "group" or "batch" (static under `jit`).
        ddof: delta degrees of freedom of the std, 0 or 1 (traced).

    Returns:
        float32 `[P, G]` advantages, 0.0 where `valid_P_G` is False.

    Raises:
        ValueError: `rewards_P_G` is not `[P, G]`, or `valid_P_G` has another shape.
    """
    _check_rewards("group_normalized_advantages", rewards_P_G, valid_P_G)
    # Constant groups are zeroed explicitly: with inexact float32 sums their centred values can
    # be a few ulps off 0, which a tiny std would blow up.
    constant_P_1 = _constant_rows(rewards_P_G, valid_P_G)[:, None]
    centered_P_G = jnp.where(constant_P_1, 0.0, _centered(rewards_P_G, valid_P_G))
    if scope == "group":
        _, count_P_1 = _group_sums(rewards_P_G, valid_P_G)
        sq_P_1 = jnp.sum(jnp.square(centered_P_G), axis=1, keepdims=True)
        dof_P_1 = count_P_1 - ddof
        std = jnp.sqrt(jnp.where(dof_P_1 > 0, sq_P_1 / jnp.maximum(dof_P_1, 1.0), 0.0))
    elif scope == "batch":
        masked_P_G = jnp.where(valid_P_G, rewards_P_G, 0.0)
        count = jnp.sum(valid_P_G).astype(jnp.float32)
        mean = jnp.sum(masked_P_G) / jnp.maximum(count, 1.0)
        sq = jnp.sum(jnp.where(valid_P_G, jnp.square(rewards_P_G - mean), 0.0))
        dof = count - ddof
        std = jnp.sqrt(jnp.where(dof > 0, sq / jnp.maximum(dof, 1.0), 0.0))
    else:
        raise ValueError(
            f"group_normalized_advantages: scope must be 'group' or 'batch', got {scope!r}"
        )
    denom = std + eps
    return jnp.where(valid_P_G & (denom > 0), centered_P_G / jnp.where(denom > 0, denom, 1.0), 0.0)


@jax.jit
def leave_one_out_advantages(rewards_P_G: jax.Array, valid_P_G: jax.Array) -> jax.Array:
    """Leave-one-out (RLOO) advantages: each reward minus the mean of the OTHER rewards.

    `A[p, g] = R[p, g] - (S_p - R[p, g]) / (G_p - 1)` with `S_p` the group sum (Kool et al.
    2019, "Buy 4 REINFORCE samples, get a baseline for free!"; Ahmadian et al. 2024,
    arXiv:2402.14740). Equals `G_p / (G_p - 1)` times the centred advantage. A group of one
    gets 0; padding gets 0.

    Args:
        rewards_P_G: float32 `[P, G]` total rewards.
        valid_P_G: bool `[P, G]` True on real entries.

    Returns:
        float32 `[P, G]` advantages, 0.0 where `valid_P_G` is False or `G_p == 1`.

    Raises:
        ValueError: `rewards_P_G` is not `[P, G]`, or `valid_P_G` has another shape.

    Examples:
        >>> import numpy as np
        >>> r = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)
        >>> [round(a, 4) for a in leave_one_out_advantages(r, np.ones((1, 4), bool))[0].tolist()]
        [0.6667, -0.6667, -0.6667, 0.6667]
    """
    _check_rewards("leave_one_out_advantages", rewards_P_G, valid_P_G)
    sum_P_1, count_P_1 = _group_sums(rewards_P_G, valid_P_G)
    others_mean_P_G = (sum_P_1 - rewards_P_G) / jnp.maximum(count_P_1 - 1.0, 1.0)
    return jnp.where(valid_P_G & (count_P_1 > 1.0), rewards_P_G - others_mean_P_G, 0.0)


@jax.jit
def constant_reward_group_mask(rewards_P_G: jax.Array, valid_P_G: jax.Array) -> jax.Array:
    """Which groups have all-equal rewards (they produce zero centred advantage everywhere).

    Compares the float32 rewards. Rows without valid entries (padding, empty groups) count as
    constant, like the cookbook's `all_same([])`. Note the cookbook decides on the float64
    totals; two distinct float64 totals that round to the same float32 value are "constant"
    here but not there — `remove_constant_reward_groups` uses the float64 totals.

    Args:
        rewards_P_G: float32 `[P, G]` total rewards.
        valid_P_G: bool `[P, G]` True on real entries.

    Returns:
        bool `[P]`, True where every valid reward of the row equals every other.

    Raises:
        ValueError: `rewards_P_G` is not `[P, G]`, or `valid_P_G` has another shape.
    """
    _check_rewards("constant_reward_group_mask", rewards_P_G, valid_P_G)
    return _constant_rows(rewards_P_G, valid_P_G)


def remove_constant_reward_groups(
    groups_P: Sequence[TrajectoryGroup],
) -> tuple[TrajectoryGroup, ...]:
    """Drops groups whose trajectories all got the same total reward (cookbook semantics).

    A group is constant when every `get_total_rewards()` value (float64) equals the first. If
    every group is constant, the FIRST group is kept (so the batch is not empty) — or nothing,
    if `groups_P` is empty. Order is preserved.

    Args:
        groups_P: the batch.

    Returns:
        The kept groups, as a tuple.
    """
    kept = []
    for group in groups_P:
        totals_G = group.get_total_rewards()
        if not all(total == totals_G[0] for total in totals_G):
            kept.append(group)
    if not kept:
        return tuple(groups_P[:1])
    return tuple(kept)


_ESTIMATORS: tuple[str, ...] = get_args(Estimator)


def compute_advantages(
    groups_P: Sequence[TrajectoryGroup],
    *,
    estimator: Estimator = "group_centered",
    eps: float = 1e-6,
) -> jax.Array:
    """Per-trajectory advantages of a whole batch in one vectorised call.

    The default, `"group_centered"`, is the cookbook's `compute_advantages` (reward minus the
    group mean; bit-equal on exact group sums). Others: `"group_normalized"` (GRPO: divided by
    the group's population std + eps), `"batch_normalized"` (group mean, batch std + eps),
    `"leave_one_out"` (RLOO). See the estimator functions for the formulas.

    Args:
        groups_P: the batch, `P` groups with ragged sizes.
        estimator: which estimator to use.
        eps: std offset of the normalised estimators (ignored by the others).

    Returns:
        float32 `[P, G_max]` (`G_max` = the largest group size): row `p` holds the advantages of
        group `p`'s trajectories in order; entries beyond a group's size are 0. Not padded in
        `P` or `G`.

    Raises:
        ValueError: for an unknown estimator or a negative / non-finite `eps`.

    Examples:
        >>> from rlpure.records import Trajectory
        >>> def group(*finals):
        ...     return TrajectoryGroup(trajectories_G=(Trajectory(transitions=()),) * len(finals),
        ...                            final_rewards_G=finals, metrics_G=({},) * len(finals))
        >>> compute_advantages([group(1.0, 0.0), group(1.0), group(0.0, 0.0, 1.0, 1.0)]).tolist()
        [[0.5, -0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [-0.5, -0.5, 0.5, 0.5]]
    """
    if estimator not in _ESTIMATORS:
        raise ValueError(
            f"compute_advantages: unknown estimator {estimator!r}; expected one of {_ESTIMATORS}"
        )
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"compute_advantages: eps must be finite and >= 0, got {eps}")
    packed = pack_rewards(groups_P)
    rewards_P_G, valid_P_G = packed.rewards_P_G, packed.valid_P_G
    if estimator == "group_centered":
        padded = group_centered_advantages(rewards_P_G, valid_P_G)
    elif estimator == "group_normalized":
        padded = group_normalized_advantages(rewards_P_G, valid_P_G, eps=eps, scope="group")
    elif estimator == "batch_normalized":
        padded = group_normalized_advantages(rewards_P_G, valid_P_G, eps=eps, scope="batch")
    else:
        padded = leave_one_out_advantages(rewards_P_G, valid_P_G)
    # Slice on the host: an eager jax slice would compile once per distinct (P, G_max).
    real = np.asarray(padded)[: packed.num_groups, : packed.max_group_size]
    out: jax.Array = jax.device_put(np.ascontiguousarray(real))
    return out


# --- loss aggregation as advantage rescaling ---------------------------------------------------


def _like(result: jax.Array, template: np.ndarray | jax.Array) -> np.ndarray | jax.Array:
    """Returns `result` as the array type of `template` (numpy stays numpy, read-only)."""
    if isinstance(template, np.ndarray):
        return np.asarray(result)  # a read-only view of the jax buffer on CPU
    return result


def _check_mask(function: str, batch: DatumBatch) -> None:
    check_shapes_equal(
        function,
        ("batch.advantages_D_T", batch.advantages_D_T),
        ("batch.mask_D_T", batch.mask_D_T),
    )


@jax.jit
def _divide_by_sequence_mask_sum(advantages_D_T: jax.Array, mask_D_T: jax.Array) -> jax.Array:
    tokens_D_1 = jnp.sum(mask_D_T, axis=1, keepdims=True)
    return advantages_D_T / jnp.maximum(tokens_D_1, 1.0)


@jax.jit
def _divide_by_batch_mask_sum(advantages_D_T: jax.Array, mask_D_T: jax.Array) -> jax.Array:
    return advantages_D_T / jnp.maximum(jnp.sum(mask_D_T), 1.0)


@jax.jit
def _divide_by_constant(advantages_D_T: jax.Array, length: jax.Array) -> jax.Array:
    return advantages_D_T / length


def aggregate_token_sum(batch: DatumBatch) -> DatumBatch:
    """Token-sum aggregation, Tinker's default: the loss is `sum_d sum_t mask * A * f(...)`.

    The identity on advantages; returns a new (shallow-copied) batch for uniformity.
    """
    return msgspec.structs.replace(batch)


def aggregate_sequence_token_mean(batch: DatumBatch) -> DatumBatch:
    """Per-sequence token mean: `A[d, t] / sum_t mask[d, t]` (the original GRPO objective).

    With a token-summing loss this averages over each datum's trained tokens, then sums over
    datums. "Sequence" means datum: a trajectory split at a prefix break into several datums
    is normalised per datum. Datums with no trained token keep advantage 0.

    Args:
        batch: float32 `advantages_D_T` and `mask_D_T` `[D, T]`.

    Returns:
        A new `DatumBatch` with rescaled `advantages_D_T` (same array type as given).

    Raises:
        ValueError: `batch.mask_D_T` and `batch.advantages_D_T` differ in shape.
    """
    _check_mask("aggregate_sequence_token_mean", batch)
    scaled = _divide_by_sequence_mask_sum(batch.advantages_D_T, batch.mask_D_T)
    return msgspec.structs.replace(batch, advantages_D_T=_like(scaled, batch.advantages_D_T))


def aggregate_batch_token_mean(batch: DatumBatch) -> DatumBatch:
    """Batch token mean (DAPO, Yu et al. 2025, arXiv:2503.14476): `A / sum_{d,t} mask[d, t]`.

    With a token-summing loss this averages over every trained token of the batch. A batch with
    no trained token is returned unchanged (all its advantages are 0).

    Raises:
        ValueError: `batch.mask_D_T` and `batch.advantages_D_T` differ in shape.
    """
    _check_mask("aggregate_batch_token_mean", batch)
    scaled = _divide_by_batch_mask_sum(batch.advantages_D_T, batch.mask_D_T)
    return msgspec.structs.replace(batch, advantages_D_T=_like(scaled, batch.advantages_D_T))


def aggregate_constant_length(batch: DatumBatch, *, length: float) -> DatumBatch:
    """Constant-length normalisation (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783): `A / L`.

    Divides by a constant `L` (e.g. the generation budget) instead of each sequence's length,
    which removes GRPO's length bias.

    Args:
        batch: the padded batch.
        length: the constant `L` (> 0, finite; traced, so changing it does not recompile).

    Raises:
        ValueError: if `length` is not a positive finite number.
    """
    if not (np.isfinite(length) and length > 0):
        raise ValueError(f"aggregate_constant_length: length must be finite and > 0, got {length}")
    scaled = _divide_by_constant(batch.advantages_D_T, jnp.float32(length))
    return msgspec.structs.replace(batch, advantages_D_T=_like(scaled, batch.advantages_D_T))


_MODES: tuple[str, ...] = get_args(AggregationMode)


def aggregate_advantages(
    batch: DatumBatch, *, mode: AggregationMode = "token_sum", length: float | None = None
) -> DatumBatch:
    """Rescales per-token advantages so Tinker's token-summing loss realises `mode`.

    Args:
        batch: the padded batch.
        mode: "token_sum" (identity), "sequence_token_mean", "batch_token_mean" or
            "constant_length" (then `length` is required).
        length: the constant of "constant_length".

    Raises:
        ValueError: for an unknown mode, or `length` missing / given for the wrong mode.
    """
    if mode not in _MODES:
        raise ValueError(f"aggregate_advantages: unknown mode {mode!r}; expected one of {_MODES}")
    if (mode == "constant_length") != (length is not None):
        raise ValueError(
            f"aggregate_advantages: length is required for mode 'constant_length' and only "
            f"for it; got mode {mode!r} and length {length!r}"
        )
    if mode == "token_sum":
        return aggregate_token_sum(batch)
    if mode == "sequence_token_mean":
        return aggregate_sequence_token_mean(batch)
    if mode == "batch_token_mean":
        return aggregate_batch_token_mean(batch)
    assert length is not None
    return aggregate_constant_length(batch, length=length)
