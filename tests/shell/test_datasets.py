"""Dataset wrappers (`shell.datasets`): epochs and weighted blends, checked by their properties.

tests/parity/test_records_env_parity.py compares the same orders with the cookbook's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Sequence

import chz
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shell.datasets import (
    EpochCycledRLDataset,
    InterleavedRLDataset,
    InterleavedRLDatasetBuilder,
    cycle_permutation,
    epoch_batch_index,
)
from shell.env import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder


@dataclasses.dataclass(frozen=True)
class Group(EnvGroupBuilder):
    """A group builder labelled `(source, batch, slot)`."""

    label: tuple[int, int, int]

    async def make_envs(self) -> Sequence[Env]:
        return []

    def logging_tags(self) -> list[str]:
        return [f"source{self.label[0]}"]


class Source(RLDataset):
    """`sizes[b]` labelled groups in batch `b`; records which batches were read."""

    def __init__(self, source: int, sizes: Sequence[int]) -> None:
        self.source = source
        self.sizes = list(sizes)
        self.reads: list[int] = []

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        self.reads.append(index)
        return [Group((self.source, index, slot)) for slot in range(self.sizes[index])]

    def __len__(self) -> int:
        return len(self.sizes)


def _labels(dataset: RLDataset, index: int) -> list[tuple[int, int, int]]:
    return [g.label for g in dataset.get_batch(index)]  # type: ignore[attr-defined]


# --- cycle_permutation / epoch_batch_index -----------------------------------------------------


@given(
    size=st.integers(0, 40),
    seed=st.integers(0, 2**32) | st.text(max_size=5),
    cycle=st.integers(0, 9),
)
def test_cycle_permutation_is_a_permutation_fixed_by_its_arguments(
    size: int, seed: int | str, cycle: int
) -> None:
    order = cycle_permutation(size, seed, cycle)
    assert sorted(order) == list(range(size))
    assert tuple(order) == tuple(cycle_permutation(size, str(seed), cycle))  # str(seed) is the key


def test_cycle_permutation_differs_between_cycles_and_seeds() -> None:
    orders = {tuple(cycle_permutation(20, seed, cycle)) for seed in range(3) for cycle in range(3)}
    assert len(orders) == 9
    with pytest.raises(ValueError, match=r"cycle_permutation: size must be >= 0"):
        cycle_permutation(-1, 0, 0)


@settings(max_examples=60)
@given(
    num_batches=st.integers(1, 12), epochs=st.integers(1, 4), seed=st.none() | st.integers(0, 99)
)
def test_every_batch_is_visited_once_per_epoch(
    num_batches: int, epochs: int, seed: int | None
) -> None:
    for epoch in range(epochs):
        visited = [
            epoch_batch_index(epoch * num_batches + pos, num_batches, seed)
            for pos in range(num_batches)
        ]
        assert sorted(visited) == list(range(num_batches))
        if seed is None:
            assert visited == list(range(num_batches))


def test_epoch_batch_index_refuses_an_empty_dataset() -> None:
    with pytest.raises(ValueError, match=r"epoch_batch_index: num_batches must be >= 1, got 0"):
        epoch_batch_index(0, 0)


# --- EpochCycledRLDataset ----------------------------------------------------------------------


def test_one_epoch_without_a_seed_is_the_inner_dataset() -> None:
    inner = Source(0, [2, 1, 3])
    cycled = EpochCycledRLDataset(inner, 1)
    assert len(cycled) == 3
    assert [_labels(cycled, i) for i in range(3)] == [_labels(inner, i) for i in range(3)]


def test_epochs_replay_whole_batches_in_a_fresh_order_per_epoch_when_seeded() -> None:
    inner = Source(0, [1] * 6)
    cycled = EpochCycledRLDataset(inner, 3, shuffle_seed=4)
    assert len(cycled) == 18
    epochs = [[_labels(cycled, e * 6 + p)[0][1] for p in range(6)] for e in range(3)]
    assert all(sorted(order) == list(range(6)) for order in epochs)
    assert len({tuple(order) for order in epochs}) > 1  # seeded epochs are reshuffled
    again = EpochCycledRLDataset(inner, 3, shuffle_seed=4)
    assert [_labels(again, i) for i in range(18)] == [_labels(cycled, i) for i in range(18)]
    unseeded = EpochCycledRLDataset(inner, 2)
    assert [_labels(unseeded, i)[0][1] for i in range(12)] == [0, 1, 2, 3, 4, 5] * 2


def test_epoch_cycled_dataset_errors() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"EpochCycledRLDataset: num_epochs must be"):
            EpochCycledRLDataset(Source(0, [1]), bad)  # type: ignore[arg-type]
    cycled = EpochCycledRLDataset(Source(0, [1, 1]), 2)
    for index in (-1, 4):
        with pytest.raises(IndexError, match=rf"batch index {index} out of range \(len=4\)"):
            cycled.get_batch(index)
    assert len(EpochCycledRLDataset(Source(0, []), 3)) == 0  # an empty inner gives no batches


# --- InterleavedRLDataset ----------------------------------------------------------------------

_SIZES = st.lists(
    st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(1, 4)),  # per batch, batches, last
    min_size=1,
    max_size=3,
)


def _sources(spec: list[tuple[int, int, int]]) -> list[Source]:
    return [
        Source(s, [per] * (batches - 1) + [min(last, per)])
        for s, (per, batches, last) in enumerate(spec)
    ]


@settings(max_examples=60, deadline=None)
@given(
    spec=_SIZES,
    groups_per_batch=st.integers(1, 6),
    total_batches=st.none() | st.integers(0, 8),
    seed=st.integers(0, 1000),
    weights_seed=st.integers(1, 5),
)
def test_interleaved_batches_have_whole_groups_each_used_once_per_pass(
    spec: list[tuple[int, int, int]],
    groups_per_batch: int,
    total_batches: int | None,
    seed: int,
    weights_seed: int,
) -> None:
    sources = _sources(spec)
    weights = [float((weights_seed + s) % 4 + 1) for s in range(len(sources))]
    blend = InterleavedRLDataset(sources, weights, groups_per_batch, total_batches, seed)
    totals = [sum(src.sizes) for src in sources]
    if total_batches is None:
        expected = max(
            1,
            min(
                int(t / (w / sum(weights) * groups_per_batch))
                for t, w in zip(totals, weights, strict=True)
            ),
        )
        assert len(blend) == expected
    else:
        assert len(blend) == total_batches
    taken: list[list[tuple[int, int]]] = [[] for _ in sources]
    for i in range(len(blend)):
        labels = _labels(blend, i)
        assert len(labels) == groups_per_batch
        for source, batch, slot in labels:
            taken[source].append((batch, slot))
    for s, seen in enumerate(taken):
        every = sorted((b, k) for b, n in enumerate(sources[s].sizes) for k in range(n))
        for start in range(0, len(seen), totals[s]):  # pass by pass: no repeats inside a pass
            chunk = seen[start : start + totals[s]]
            assert len(set(chunk)) == len(chunk)
            if len(chunk) == totals[s]:
                assert sorted(chunk) == every
    again = InterleavedRLDataset(_sources(spec), weights, groups_per_batch, total_batches, seed)
    assert [_labels(again, i) for i in range(len(again))] == [
        _labels(blend, i) for i in range(len(blend))
    ]


def test_interleaved_dataset_probes_each_source_once_and_resolves_lazily() -> None:
    sources = [Source(0, [2, 2, 2]), Source(1, [5])]
    blend = InterleavedRLDataset(sources, [1, 1], 2, total_batches=3, seed=0)
    assert sources[0].reads == [0, 2] and sources[1].reads == [0]  # first and last batch
    assert blend.schedule(1) == blend.schedule(1) and len(blend.schedule(1)) == 2
    assert sources[0].reads == [0, 2]  # the schedule needs no reads
    weights_scaled = InterleavedRLDataset(
        [Source(0, [2, 2, 2]), Source(1, [5])], [55, 55], 2, total_batches=3, seed=0
    )
    assert [weights_scaled.schedule(i) for i in range(3)] == [blend.schedule(i) for i in range(3)]


def test_interleaved_weights_set_the_share_of_slots() -> None:
    blend = InterleavedRLDataset(
        [Source(0, [10] * 10), Source(1, [10] * 10)], [3, 1], 10, total_batches=40, seed=1
    )
    counts = Counter(s for i in range(len(blend)) for s, _ in blend.schedule(i))
    assert counts[0] / 400 == pytest.approx(0.75, abs=0.06)


@pytest.mark.parametrize(
    ("sources", "weights", "groups_per_batch", "total_batches", "match"),
    [
        ([[1]], [1.0, 2.0], 1, None, r"same length, got 1 sources and 2 weights"),
        ([], [], 1, None, r"at least one source is required"),
        ([[1], [1]], [1.0, 0.0], 1, None, r"weights must be positive finite numbers"),
        ([[1]], [float("nan")], 1, None, r"weights must be positive finite numbers"),
        ([[1]], [1.0], 0, None, r"groups_per_batch must be >= 1, got 0"),
        ([[1]], [1.0], 1, -1, r"total_batches must be >= 0 or None, got -1"),
        ([[]], [1.0], 1, None, r"source 0 has 0 batches"),
        ([[1], [0, 1]], [1.0, 1.0], 1, None, r"source 1 returned 0 groups for batch 0"),
    ],
)
def test_interleaved_dataset_errors_are_one_line(
    sources: list[list[int]],
    weights: list[float],
    groups_per_batch: int,
    total_batches: int | None,
    match: str,
) -> None:
    with pytest.raises(ValueError, match=r"^InterleavedRLDataset: .*" + match) as err:
        InterleavedRLDataset(
            [Source(s, b) for s, b in enumerate(sources)], weights, groups_per_batch, total_batches
        )
    assert "\n" not in str(err.value)


def test_interleaved_dataset_index_errors() -> None:
    blend = InterleavedRLDataset([Source(0, [3, 1, 3])], [1.0], 7, total_batches=1)
    with pytest.raises(IndexError, match=r"source 0 batch 1 has 1 groups, expected 3"):
        blend.get_batch(0)  # a short middle batch
    with pytest.raises(IndexError, match=r"batch index 1 out of range \(total_batches=1\)"):
        blend.get_batch(1)


# --- InterleavedRLDatasetBuilder ---------------------------------------------------------------


@chz.chz
class SourceBuilder(RLDatasetBuilder):
    source: int
    sizes: tuple[int, ...]

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return Source(self.source, self.sizes), Source(99, (1,))


def test_builder_blends_the_train_datasets_and_drops_the_test_datasets() -> None:
    builder = InterleavedRLDatasetBuilder(
        sources=[SourceBuilder(source=0, sizes=(2, 2)), SourceBuilder(source=1, sizes=(3,))],
        weights=[1.0, 1.0],
        groups_per_batch=2,
        total_batches=4,
        seed=9,
    )
    train, test = asyncio.run(builder())
    assert test is None
    assert isinstance(train, InterleavedRLDataset) and len(train) == 4
    direct = InterleavedRLDataset(
        [Source(0, (2, 2)), Source(1, (3,))], [1.0, 1.0], 2, total_batches=4, seed=9
    )
    assert [_labels(train, i) for i in range(4)] == [_labels(direct, i) for i in range(4)]
    tags = {tag for i in range(4) for g in train.get_batch(i) for tag in g.logging_tags()}
    assert tags <= {"source0", "source1"}


def test_builder_has_the_cookbook_defaults_and_keyword_construction() -> None:
    builder = InterleavedRLDatasetBuilder(sources=[], weights=[], groups_per_batch=3)
    assert (builder.total_batches, builder.seed) == (None, 0)
    with pytest.raises(TypeError):
        InterleavedRLDatasetBuilder([], [], 3)  # type: ignore[misc]
