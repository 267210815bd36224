"""Properties of the prefix groups (`rlpure.packing._prefix_groups`) and their attention mask.

Sequences come from `test_prefix_tree`'s strategy (a 3-token alphabet, often extensions of one
another: shared prefixes, duplicates, sequences that are prefixes of others). Each grouping is
checked against its contract (every sequence once, the group's prefix shared by all its
sequences, suffixes within their width) and its group count against a slow optimum over every
split of the sorted sequences into runs; each plan against its layout (chunks within the
budget, counts of positions and key reads).
"""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.model import suffix_attention_mask
from rlpure.packing import (
    common_prefix_length,
    group_shared_prefixes,
    plan_grouped_chunks,
    sort_sequences,
)
from rlpure.packing._prefix_groups import _bucket_range
from tests.core.test_prefix_tree import sequence_sets


def _fewest_runs(seqs: list[np.ndarray], s: int, u: int, max_datums: int) -> int | None:
    """The fewest runs of the sorted sequences that each fit (every split tried)."""
    order = sort_sequences(seqs).order_K
    n = len(order)

    def fits(run: tuple[int, ...]) -> bool:
        members = [seqs[order[k]] for k in run]
        shared = min(common_prefix_length(members[0], m) for m in members)
        shared = min(shared, s)
        return len(run) <= max_datums and all(m.size - shared <= u for m in members)

    best = None
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0, *[k + 1 for k, cut in enumerate(cuts) if cut], n]
        runs = [tuple(range(a, b)) for a, b in itertools.pairwise(bounds)]
        if all(fits(run) for run in runs) and (best is None or len(runs) < best):
            best = len(runs)
    return best


@settings(max_examples=150, deadline=None)
@given(
    sequence_sets(),
    st.integers(1, 8),
    st.integers(1, 8),
    st.integers(1, 4),
)
def test_groups_share_their_prefix_fit_their_suffixes_and_are_fewest(
    seqs: list[np.ndarray], s: int, u: int, max_datums: int
) -> None:
    groups = group_shared_prefixes(
        sort_sequences(seqs), prefix_width=s, suffix_width=u, max_datums=max_datums
    )
    if max(x.size for x in seqs) > s + u:
        assert groups is None
        return
    assert groups is not None
    assert sorted(d for g in groups for d in g.datums) == list(range(len(seqs)))
    for group in groups:
        first = seqs[group.datums[0]]
        assert 0 <= group.prefix_length <= s
        assert len(group.datums) <= max_datums
        for d in group.datums:
            assert common_prefix_length(first, seqs[d]) >= group.prefix_length
            assert seqs[d].size - group.prefix_length <= u
        # the prefix is as long as the group allows: the common prefix, capped at s
        shared = min(common_prefix_length(first, seqs[d]) for d in group.datums)
        assert group.prefix_length == min(shared, s)
    assert len(groups) == _fewest_runs(seqs, s, u, max_datums)


@settings(max_examples=100, deadline=None)
@given(sequence_sets(), st.integers(8, 64), st.floats(0.0, 0.05))
def test_plans_cover_every_sequence_within_the_budget(
    seqs: list[np.ndarray], budget: int, key_weight: float
) -> None:
    plan = plan_grouped_chunks(seqs, positions_for_keys=lambda keys: budget, key_weight=key_weight)
    longest = max(x.size for x in seqs)
    widths = [
        (s, u)
        for s in _bucket_range(longest, minimum=16, steps_per_octave=4)
        for u in _bucket_range(longest, minimum=4, steps_per_octave=2)
    ]
    if plan is None:  # only when no widths hold the longest sequence within the budget
        assert not any(longest <= s + u <= budget for s, u in widths)
        return
    s, u = plan.prefix_width, plan.suffix_width
    index = [d for chunk in plan.chunks for d in chunk.index_D]
    assert sorted(index) == list(range(len(seqs)))
    for chunk in plan.chunks:
        assert len(chunk.groups) <= plan.prefix_rows and len(chunk.index_D) <= plan.datums
        for group in chunk.groups:
            assert all(seqs[d].size - group.prefix_length <= u for d in group.datums)
    assert plan.prefix_rows * s + plan.datums * u <= budget  # every chunk, padded, fits
    p, d = plan.prefix_rows, plan.datums
    assert plan.positions == len(plan.chunks) * (p * s + d * u)
    assert plan.key_reads == len(plan.chunks) * (p * s * s + d * u * (s + u))


def test_the_plan_of_a_grpo_batch_computes_each_prompt_once() -> None:
    """16 prompts of 128 tokens × 8 answers of 31: 16 prefix rows of 128 and 128 suffix rows
    of 32, 4 chunks of 1,536 positions (the benchmark's batch and SmolLM2's budget)."""
    rng = np.random.default_rng(0)
    seqs = []
    for _ in range(16):
        prompt = rng.integers(0, 1000, 128)
        seqs += [np.concatenate([prompt, rng.integers(0, 1000, 31)]) for _ in range(8)]
    plan = plan_grouped_chunks(seqs, positions_for_keys=lambda keys: 1693, key_weight=5e-4)
    assert plan is not None
    assert (len(plan.chunks), plan.prefix_rows, plan.prefix_width) == (4, 4, 128)
    assert (plan.datums, plan.suffix_width, plan.positions) == (32, 32, 6144)
    assert all(g.prefix_length == 128 for c in plan.chunks for g in c.groups)


def test_suffix_attention_mask_reads_the_shared_prefix_and_the_own_causal_keys() -> None:
    mask = np.asarray(suffix_attention_mask(jnp.array([2, 0]), 3, 2))
    assert mask[0].astype(int).tolist() == [[1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]
    assert mask[1].astype(int).tolist() == [[0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
