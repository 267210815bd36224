"""Token accounting: what a training step sampled, prefilled and trained (pure counting).

The counts and metric names are tinker-cookbook 0.6.1's (`utils/cost_estimation.py`
`TokenUsage`, `rl/train.py` `rollout_usage` / `training_usage`):

- `sampled`: every action token of every transition (`len(ac.tokens)`).
- `prefill_cached` / `prefill_uncached`: every turn's observation is prefilled in full, so a
  multi-turn trajectory counts each turn's whole observation (a prefix shared with earlier turns
  is counted again); of those, `ac.prompt_cache_hit_tokens` per turn are the prefix-cache hits
  the sampler reported, the rest are uncached.
- `trained`: the tokens of the datums sent to `forward_backward`, i.e. the sum of their
  `model_input` lengths (each datum's full sequence minus its last token); turns merged into one
  datum (an observation extending the sequence so far) count their shared prefix once.

Metrics: one step's usage as `tokens/<kind>`, the running totals as `tokens/cumulative/<kind>`
(`TokenUsage.metrics`). Groups dropped before training (constant reward) are not part of any
step: their rollout usage goes into the running totals and into a separate discarded total
(`tokens/discarded/<kind>`), as the cookbook's `CostTracker.record_discarded_sampling`.

No IO; the shell keeps the running totals and saves them in checkpoint rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import msgspec
import numpy as np

from rlpure.packing import DatumBatch, trajectory_segments
from rlpure.records import TrajectoryGroup

__all__ = [
    "TOKEN_KINDS",
    "TokenUsage",
    "rollout_usage",
    "trained_tokens_of_batch",
    "training_usage",
]

TOKEN_KINDS = ("sampled", "prefill_cached", "prefill_uncached", "trained")
"""The four kinds of billed tokens, in the cookbook's order."""


class TokenUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts by kind (the cookbook's `TokenUsage`); all >= 0.

    Attributes:
        sampled: tokens returned by sampling requests.
        prefill_cached: prompt tokens reported as prefix-cache hits.
        prefill_uncached: the other prompt tokens.
        trained: tokens in the datums sent to `forward_backward`.
    """

    sampled: int = 0
    prefill_cached: int = 0
    prefill_uncached: int = 0
    trained: int = 0

    def __post_init__(self) -> None:
        for kind in TOKEN_KINDS:
            if getattr(self, kind) < 0:
                raise ValueError(f"TokenUsage.{kind}: expected >= 0, got {getattr(self, kind)}")

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            sampled=self.sampled + other.sampled,
            prefill_cached=self.prefill_cached + other.prefill_cached,
            prefill_uncached=self.prefill_uncached + other.prefill_uncached,
            trained=self.trained + other.trained,
        )

    def as_dict(self) -> dict[str, int]:
        """`{kind: count}`, the cookbook's checkpoint `cumulative_tokens` mapping.

        Examples:
            >>> TokenUsage(sampled=3).as_dict()
            {'sampled': 3, 'prefill_cached': 0, 'prefill_uncached': 0, 'trained': 0}
        """
        return {kind: int(getattr(self, kind)) for kind in TOKEN_KINDS}

    def metrics(self, prefix: str) -> dict[str, int]:
        """The counts as `<prefix>/<kind>` metrics.

        Examples:
            >>> TokenUsage(trained=4).metrics("tokens")["tokens/trained"]
            4
        """
        return {f"{prefix}/{kind}": count for kind, count in self.as_dict().items()}

    @classmethod
    def from_mapping(cls, counts: Mapping[str, int] | None, *, where: str) -> TokenUsage:
        """Reads a `{kind: count}` mapping (a checkpoint row's `cumulative_tokens`); None or
        missing kinds count 0.

        Raises:
            ValueError: an unknown kind or a count that is not a non-negative int, naming
                `where`.
        """
        if counts is None:
            return cls()
        unknown = sorted(set(counts) - set(TOKEN_KINDS))
        if unknown:
            raise ValueError(f"{where}: unknown token kinds {unknown}; expected {TOKEN_KINDS}")
        values: dict[str, int] = {}
        for kind, count in counts.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"{where}.{kind}: expected an int >= 0, got {count!r}")
            values[kind] = count
        return cls(**values)


def rollout_usage(groups_P: Iterable[TrajectoryGroup]) -> TokenUsage:
    """The sampling the groups' rollouts were billed for (the cookbook's `rollout_usage`).

    Every action token was sampled and every turn's observation prefilled, split into cached
    and uncached by that turn's `ac.prompt_cache_hit_tokens` (capped at the observation's
    length, so a sampler over-reporting hits never makes the uncached count negative; the
    cookbook does not cap).
    """
    sampled = cached = uncached = 0
    for group in groups_P:
        for trajectory in group.trajectories_G:
            for transition in trajectory.transitions:
                prompt = transition.ob.length
                hits = min(transition.ac.prompt_cache_hit_tokens, prompt)
                sampled += len(transition.ac.tokens)
                cached += hits
                uncached += prompt - hits
    return TokenUsage(sampled=sampled, prefill_cached=cached, prefill_uncached=uncached)


def training_usage(groups_P: Sequence[TrajectoryGroup]) -> TokenUsage:
    """The tokens the datums of these groups send to `forward_backward` (`trained` only).

    The datums are the cookbook's `trajectory_to_data` split (`rlpure.packing`): one per run
    of turns whose observations extend the sequence so far; each counts its full sequence
    minus the last token (its `model_input` length). Equal to the cookbook's
    `training_usage(datums)` on the datums `assemble_batch` + `shell.datums` build.

    Raises:
        ValueError: a trajectory that makes no valid datum (see `trajectory_segments`).
    """
    trained = 0
    for p, group in enumerate(groups_P):
        for g, trajectory in enumerate(group.trajectories_G):
            for segment in trajectory_segments(trajectory, 0.0, where=(p, g)):
                trained += segment.full_length - 1
    return TokenUsage(trained=trained)


def trained_tokens_of_batch(batch: DatumBatch) -> int:
    """The `model_input` tokens of a padded batch's real datums (`sum(length_D[:num_datums])`)."""
    n = int(batch.num_datums)
    return int(np.asarray(batch.length_D)[:n].sum())
