"""Properties of the prefix tries (`rlpure.packing._prefix_tree`) and their attention mask.

Sequences are drawn from a 3-token alphabet, often as extensions of one another, so that
shared prefixes, duplicates and sequences that are prefixes of others all occur; each packed
trie is checked against the set of distinct prefixes and a slow ancestor rule written with
Python loops.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.model import prefix_attention_mask
from rlpure.packing import (
    common_prefix_length,
    group_prefix_rows,
    pack_prefix_tree,
    prefix_tree_size,
)


@st.composite
def sequence_sets(draw: st.DrawFn) -> list[np.ndarray]:
    """1–8 non-empty sequences; each later one may extend a prefix of an earlier one."""
    out: list[list[int]] = []
    for _ in range(draw(st.integers(1, 8))):
        stem: list[int] = []
        extend: bool = draw(st.booleans())
        if out and extend:
            base = out[draw(st.integers(0, len(out) - 1))]
            stem = base[: draw(st.integers(0, len(base)))]
        tail = draw(st.lists(st.integers(0, 2), min_size=0 if stem else 1, max_size=6))
        out.append(stem + tail)
    return [np.asarray(s, np.int64) for s in out]


def _distinct_prefixes(seqs: list[np.ndarray]) -> set[tuple[int, ...]]:
    return {tuple(s[: t + 1].tolist()) for s in seqs for t in range(s.size)}


@settings(max_examples=200, deadline=None)
@given(sequence_sets())
def test_the_trie_holds_each_distinct_prefix_once(seqs: list[np.ndarray]) -> None:
    tree = pack_prefix_tree(seqs)
    distinct = _distinct_prefixes(seqs)
    assert tree.tokens_N.size == prefix_tree_size(seqs) == len(distinct)
    # Each node is one distinct prefix: read off through any datum that reaches it.
    node_prefix: dict[int, tuple[int, ...]] = {}
    for s, columns in zip(seqs, tree.column_D, strict=True):
        assert columns.shape == s.shape
        for t, j in enumerate(columns.tolist()):
            assert tree.tokens_N[j] == s[t] and tree.position_N[j] == t
            assert node_prefix.setdefault(j, tuple(s[: t + 1].tolist())) == tuple(
                s[: t + 1].tolist()
            )
    assert set(node_prefix.values()) == distinct and len(node_prefix) == len(distinct)


@settings(max_examples=200, deadline=None)
@given(sequence_sets())
def test_a_node_reads_exactly_its_own_sequence_so_far(seqs: list[np.ndarray]) -> None:
    """The rule `j ≤ i < end_j` gives each datum position exactly its own earlier tokens."""
    tree = pack_prefix_tree(seqs)
    n = tree.tokens_N.size
    for columns in tree.column_D:
        for t in range(columns.size):
            i = int(columns[t])
            readable = {j for j in range(n) if j <= i < tree.end_N[j]}
            assert readable == set(columns[: t + 1].tolist())
    # Pre-order: a subtree is contiguous and nested within its parent's.
    for j in range(n):
        assert j < tree.end_N[j] <= n
        inside = tree.position_N[j + 1 : tree.end_N[j]]
        assert np.all(inside > tree.position_N[j])


@settings(max_examples=100, deadline=None)
@given(sequence_sets(), st.integers(1, 12))
def test_rows_partition_the_sequences_within_the_width(
    seqs: list[np.ndarray], max_width: int
) -> None:
    rows = group_prefix_rows(seqs, max_width=max_width)
    assert sorted(d for row in rows for d in row) == list(range(len(seqs)))
    for row in rows:
        members = [seqs[d] for d in row]
        assert prefix_tree_size(members) <= max_width or len(row) == 1


@settings(max_examples=100, deadline=None)
@given(sequence_sets())
def test_the_jax_mask_is_the_ancestor_rule(seqs: list[np.ndarray]) -> None:
    tree = pack_prefix_tree(seqs)
    n = tree.tokens_N.size
    width = 64  # at most 8 × 6 nodes; one width, so one compile; padding reads itself only
    end_W = np.concatenate([tree.end_N, np.arange(n + 1, width + 1)])
    mask_W_W = np.asarray(prefix_attention_mask(jnp.asarray(end_W[None], jnp.int32)))[0]
    expected = np.array(
        [[j <= i < end_W[j] for j in range(width)] for i in range(width)], dtype=bool
    )
    np.testing.assert_array_equal(mask_W_W, expected)


def test_golden_nested_sharing_and_a_datum_that_is_a_prefix_of_another() -> None:
    # prompt [7, 8], sub-prompts [7, 8, 1] / [7, 8, 2], completions; [7, 8, 1] is a datum too.
    seqs = [np.array(s) for s in ([7, 8, 1, 5], [7, 8, 2, 6], [7, 8, 1], [7, 8, 1, 4], [3])]
    tree = pack_prefix_tree(seqs)
    assert tree.tokens_N.tolist() == [3, 7, 8, 1, 4, 5, 2, 6]
    assert tree.position_N.tolist() == [0, 0, 1, 2, 3, 3, 2, 3]
    assert tree.end_N.tolist() == [1, 8, 8, 6, 5, 6, 8, 8]
    assert [c.tolist() for c in tree.column_D] == [
        [1, 2, 3, 5],
        [1, 2, 6, 7],
        [1, 2, 3],
        [1, 2, 3, 4],
        [0],
    ]
    assert common_prefix_length(seqs[0], seqs[3]) == 3


def test_bad_inputs_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"tokens_D\[1\]"):
        pack_prefix_tree([np.array([1]), np.array([], np.int64)])
    with pytest.raises(ValueError, match="max_width"):
        group_prefix_rows([np.array([1])], max_width=0)
