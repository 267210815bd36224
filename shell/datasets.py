"""Dataset wrappers: several epochs of one `RLDataset`, and a weighted blend of several.

The cookbook's `rl/dataset_utils.py` and `rl/interleaved.py` (tinker-cookbook 0.6.1), with its
names, constructor signatures and orders, so a run that mixes or repeats datasets sees exactly
the batches the cookbook's loop would (`shell.cookbook.rl.dataset_utils` / `shell.cookbook.rl.interleaved`
re-export them).

Conventions:
- Orders are pure functions of their seeds: `cycle_permutation(size, seed, cycle)` is the
  permutation `random.Random(f"{seed}:{cycle}")` shuffles `range(size)` into, so any index of
  any pass resolves without replaying earlier ones, and a resumed run sees the order the
  original would have (the training loop asks for batch `i` by index only).
- An epoch (`EpochCycledRLDataset`) reorders whole batches; a batch keeps its groups.
- The blend (`InterleavedRLDatasetBuilder`) addresses groups, not batches: each slot of an
  output batch is one `EnvGroupBuilder` of one source, so GRPO's within-group centring still
  compares rollouts of one problem. Source `s` is drawn for each slot with probability
  `weights[s] / sum(weights)` from `random.Random(seed)`; within a source, groups are taken in
  `cycle_permutation(total_groups, f"{seed}:{s}", cycle)` order, a fresh permutation per pass.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
from collections.abc import Sequence

import chz

from shell.env import EnvGroupBuilder, RLDataset, RLDatasetBuilder

__all__ = [
    "EpochCycledRLDataset",
    "InterleavedRLDataset",
    "InterleavedRLDatasetBuilder",
    "cycle_permutation",
    "epoch_batch_index",
]

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=64)
def _shuffled_range(size: int, seed: str, cycle: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(f"{seed}:{cycle}").shuffle(order)
    return tuple(order)


def cycle_permutation(size: int, seed: int | str, cycle: int) -> Sequence[int]:
    """The order of `range(size)` in pass `cycle` over a dataset, fixed by `(size, seed, cycle)`.

    Args:
        size: number of items (>= 0).
        seed: any int or string; `7` and `"7"` give the same permutation.
        cycle: the pass number (0 for the first).

    Returns:
        A permutation of `range(size)` (a tuple; cached, so do not rely on identity).

    Examples:
        >>> sorted(cycle_permutation(5, 0, 3)) == list(range(5))
        True
        >>> cycle_permutation(5, 1, 0) == cycle_permutation(5, "1", 0)
        True
    """
    if size < 0:
        raise ValueError(f"cycle_permutation: size must be >= 0, got {size}")
    return _shuffled_range(size, str(seed), cycle)


def epoch_batch_index(index: int, num_batches: int, shuffle_seed: int | None = None) -> int:
    """The inner batch that global step `index` reads when a dataset is repeated.

    Epoch `index // num_batches` visits the batches in order, or in
    `cycle_permutation(num_batches, shuffle_seed, epoch)` order when `shuffle_seed` is set.

    Examples:
        >>> [epoch_batch_index(i, 3) for i in range(7)]
        [0, 1, 2, 0, 1, 2, 0]
    """
    if num_batches < 1:
        raise ValueError(f"epoch_batch_index: num_batches must be >= 1, got {num_batches}")
    epoch, position = divmod(index, num_batches)
    if shuffle_seed is None:
        return position
    return cycle_permutation(num_batches, shuffle_seed, epoch)[position]


class EpochCycledRLDataset(RLDataset):
    """`inner` repeated for `num_epochs` passes.

    Global batch `i` is in epoch `i // len(inner)`. Without `shuffle_seed` it is
    `inner.get_batch(i % len(inner))`: each epoch replays `inner` in its order, and
    `num_epochs=1` is `inner` itself. With `shuffle_seed`, each epoch visits the inner batches in
    a fresh `cycle_permutation(len(inner), shuffle_seed, epoch)` order.

    Args:
        inner: the dataset to repeat (an empty one gives an empty dataset).
        num_epochs: number of passes (>= 1).
        shuffle_seed: reshuffle the batch order every epoch, deterministically per
            `(shuffle_seed, epoch)`; None keeps `inner`'s order.
    """

    def __init__(self, inner: RLDataset, num_epochs: int, shuffle_seed: int | None = None):
        if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
            raise ValueError(
                f"EpochCycledRLDataset: num_epochs must be an integer >= 1, got {num_epochs!r}"
            )
        self.inner = inner
        self.num_epochs = num_epochs
        self.shuffle_seed = shuffle_seed

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(
                f"EpochCycledRLDataset: batch index {index} out of range (len={len(self)})"
            )
        return self.inner.get_batch(epoch_batch_index(index, len(self.inner), self.shuffle_seed))

    def __len__(self) -> int:
        return len(self.inner) * self.num_epochs


class InterleavedRLDataset(RLDataset):
    """Batches of `groups_per_batch` groups drawn from several datasets by weight.

    What `InterleavedRLDatasetBuilder` builds (the cookbook's private `_InterleavedRLDataset`).
    The whole schedule, `(source, group)` for every slot of every batch, is fixed at
    construction from `seed`; groups are fetched from their source only in `get_batch`. Each
    source is probed once (its first and last batch) to learn its groups per batch and its total
    groups; every batch but its last must have as many groups as its first.

    Args:
        sources: the datasets to blend (each non-empty, at least one group per batch).
        weights: relative weight of each source (positive; normalised to sum to 1).
        groups_per_batch: groups in each output batch (>= 1).
        total_batches: number of output batches; sources are cycled when exhausted. None: until
            the first source runs out in expectation, `min_s int(total_s / (w_s * groups))`
            (at least 1), without cycling.
        seed: fixes both the source drawn for each slot and each source's group order.

    Raises:
        ValueError: mismatched lengths, no source, a non-positive weight, `groups_per_batch`
            < 1, a negative `total_batches`, or an empty source.
    """

    def __init__(
        self,
        sources: Sequence[RLDataset],
        weights: Sequence[float],
        groups_per_batch: int,
        total_batches: int | None = None,
        seed: int = 0,
    ):
        name = "InterleavedRLDataset"
        if len(sources) != len(weights):
            raise ValueError(
                f"{name}: sources and weights must have the same length, got {len(sources)} "
                f"sources and {len(weights)} weights"
            )
        if not sources:
            raise ValueError(f"{name}: at least one source is required")
        if not all(isinstance(w, (int, float)) and math.isfinite(w) and w > 0 for w in weights):
            raise ValueError(f"{name}: all weights must be positive finite numbers, got {weights}")
        if groups_per_batch < 1:
            raise ValueError(f"{name}: groups_per_batch must be >= 1, got {groups_per_batch}")
        if total_batches is not None and total_batches < 0:
            raise ValueError(f"{name}: total_batches must be >= 0 or None, got {total_batches}")
        self._sources = list(sources)
        self._groups_per_batch = groups_per_batch
        self._seed = seed
        weight_sum = sum(weights)
        self._weights = [w / weight_sum for w in weights]
        self._source_groups_per_batch: list[int] = []
        self._source_total_groups: list[int] = []
        for s, source in enumerate(self._sources):
            num_batches = len(source)
            if num_batches == 0:
                raise ValueError(
                    f"{name}: source {s} has 0 batches; every source must be non-empty"
                )
            per_batch = len(source.get_batch(0))
            if per_batch == 0:
                raise ValueError(
                    f"{name}: source {s} returned 0 groups for batch 0; every source must give "
                    "at least 1 group per batch"
                )
            last = per_batch if num_batches == 1 else len(source.get_batch(num_batches - 1))
            self._source_groups_per_batch.append(per_batch)
            self._source_total_groups.append((num_batches - 1) * per_batch + last)
        if total_batches is None:
            total_batches = self._exhaustion_length()
            logger.info(
                "InterleavedRLDataset: total_batches not set, using smallest-source "
                "exhaustion: %d batches",
                total_batches,
            )
        self._total_batches = total_batches
        self._schedule, counts = self._build_schedule()
        logger.info(
            "InterleavedRLDataset: %d sources, weights=%s, %d batches, %d groups/batch",
            len(self._sources),
            [f"{w:.2f}" for w in self._weights],
            total_batches,
            groups_per_batch,
        )
        scheduled = max(1, sum(counts))
        for s, count in enumerate(counts):
            total = self._source_total_groups[s]
            logger.info(
                "  Source %d: %d total groups, %d scheduled (~%.0f%%, %s)",
                s,
                total,
                count,
                count / scheduled * 100,
                "cycles" if count > total else "partial",
            )

    def _exhaustion_length(self) -> int:
        """Batches until the first source is used up: `min_s int(total_s / (w_s * groups))`."""
        lengths = [
            int(total / (weight * self._groups_per_batch))
            for total, weight in zip(self._source_total_groups, self._weights, strict=True)
        ]
        return max(1, min(lengths))

    def _build_schedule(self) -> tuple[list[list[tuple[int, int]]], list[int]]:
        """`(source, flat group index)` of every slot of every batch, and groups per source."""
        draw = random.Random(self._seed)
        indices = range(len(self._sources))
        passes = [0] * len(self._sources)
        taken = [0] * len(self._sources)  # groups taken from the current pass
        counts = [0] * len(self._sources)
        schedule: list[list[tuple[int, int]]] = []
        for _ in range(self._total_batches):
            batch: list[tuple[int, int]] = []
            for _ in range(self._groups_per_batch):
                s = draw.choices(indices, weights=self._weights, k=1)[0]
                total = self._source_total_groups[s]
                if taken[s] >= total:
                    passes[s] += 1
                    taken[s] = 0
                order = cycle_permutation(total, f"{self._seed}:{s}", passes[s])
                batch.append((s, order[taken[s]]))
                taken[s] += 1
                counts[s] += 1
            schedule.append(batch)
        return schedule, counts

    def schedule(self, index: int) -> list[tuple[int, int]]:
        """The `(source, flat group index)` pairs of batch `index`, without fetching groups."""
        self._check_index(index)
        return list(self._schedule[index])

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self._total_batches:
            raise IndexError(
                f"InterleavedRLDataset: batch index {index} out of range "
                f"(total_batches={self._total_batches})"
            )

    def _group(self, s: int, flat: int) -> EnvGroupBuilder:
        per_batch = self._source_groups_per_batch[s]
        batch_index, within = divmod(flat, per_batch)
        batch = self._sources[s].get_batch(batch_index)
        if within >= len(batch):
            raise IndexError(
                f"InterleavedRLDataset: source {s} batch {batch_index} has {len(batch)} groups, "
                f"expected {per_batch} (as its batch 0); every batch but the last must have as "
                "many groups as batch 0"
            )
        return batch[within]

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        """The `groups_per_batch` group builders of batch `index`, each from one source."""
        self._check_index(index)
        return [self._group(s, flat) for s, flat in self._schedule[index]]

    def __len__(self) -> int:
        return self._total_batches


@chz.chz
class InterleavedRLDatasetBuilder(RLDatasetBuilder):
    """Blends several dataset builders into one training dataset (multi-domain RL).

    Builds every source concurrently, keeps their training datasets (their test datasets are
    dropped: set up evaluation separately) and blends them into an `InterleavedRLDataset`.
    Per-domain metrics come from each source's `EnvGroupBuilder.logging_tags`.

    Attributes:
        sources: the builders to blend.
        weights: relative weight of each source (positive; `[55, 30, 15]` equals
            `[0.55, 0.30, 0.15]`): the expected share of group slots it fills.
        groups_per_batch: groups (problems) per output batch; each source's group builders
            keep their own group size.
        total_batches: fixed number of training batches, cycling sources as they run out;
            None runs until the smallest source is exhausted.
        seed: fixes the source of each slot and each source's group order.

    Examples:
        >>> builder = InterleavedRLDatasetBuilder(sources=[], weights=[], groups_per_batch=8)
        >>> builder.total_batches is None and builder.seed == 0
        True
    """

    sources: list[RLDatasetBuilder]
    weights: list[float]
    groups_per_batch: int
    total_batches: int | None = None
    seed: int = 0

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        """`(the blended training dataset, None)`."""
        built = await asyncio.gather(*(source() for source in self.sources))
        train: list[RLDataset] = []
        for s, (train_dataset, _test_dataset) in enumerate(built):
            train.append(train_dataset)
            logger.info(
                "Source %d (%s): %d batches, weight=%s",
                s,
                type(self.sources[s]).__name__,
                len(train_dataset),
                self.weights[s],
            )
        blended = InterleavedRLDataset(
            sources=train,
            weights=self.weights,
            groups_per_batch=self.groups_per_batch,
            total_batches=self.total_batches,
            seed=self.seed,
        )
        return blended, None
