"""Token sequences that share prefixes, packed as tries so each shared prefix is computed once.

A GRPO batch trains each prompt once per sampled completion (and a multi-turn episode's history
once per turn): its datums' `model_input`s share long prefixes. Here they become token tries,
each trie laid out as one packed row in depth-first pre-order, so a causal model computes every
distinct prefix once and every datum reads its positions back by a gather.

Conventions:
- A trie node is a distinct non-empty prefix `tokens[: t + 1]` of some sequence; it holds the
  token `tokens[t]` at position `t` (its depth). Two sequences share the nodes of their longest
  common prefix (`lcp`), so a row holds `Σ_i (len(s_i) − lcp(s_i, s_{i−1}))` nodes over its
  sequences sorted lexicographically (a sorted list's longest earlier match is its
  predecessor).
- Pre-order: a node's subtree is the contiguous run `[j, end_j)` of the row, so the attention
  rule "query `i` may read key `j`" is `j ≤ i < end_j`: `j` is `i` itself or an ancestor, i.e.
  exactly the tokens before `i` in `i`'s own sequence. One int array per row (`end_N`) encodes
  any sharing pattern, so a new pattern of the same padded size needs no new compile.
- `column_D[d][t]` is the row index of datum `d`'s node at position `t`; the model's output at
  that index is the datum's output at `t` (causal: it depends on `tokens[: t + 1]` only).
- Padding after a row's nodes holds token 0 at position 0 with `end = index + 1` (a padded
  query reads itself only, so its softmax stays finite).
- Host-side numpy (memory movement, not maths).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
import numpy as np

__all__ = [
    "PrefixTree",
    "common_prefix_length",
    "group_prefix_rows",
    "pack_prefix_tree",
    "prefix_tree_size",
]


class PrefixTree(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """Sequences packed as one trie row in pre-order (see the module docstring).

    Attributes:
        tokens_N: int64 `[N]`, each node's token (`N` distinct prefixes).
        position_N: int64 `[N]`, each node's position in its sequences (its depth − 1).
        end_N: int64 `[N]`, the row index just after each node's subtree.
        column_D: for each sequence `d` (in the order given), int64 `[len_d]`: the row index of
            its node at each position.
    """

    tokens_N: np.ndarray
    position_N: np.ndarray
    end_N: np.ndarray
    column_D: tuple[np.ndarray, ...]


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D token arrays.

    Examples:
        >>> common_prefix_length(np.array([1, 2, 3]), np.array([1, 2, 4, 5]))
        2
    """
    n = min(a.size, b.size)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _lexicographic_order(tokens_D: Sequence[np.ndarray]) -> list[int]:
    """Indices of `tokens_D` sorted lexicographically (a prefix before its extensions), stable."""
    return sorted(range(len(tokens_D)), key=lambda d: tuple(int(x) for x in tokens_D[d]))


def prefix_tree_size(tokens_D: Sequence[np.ndarray]) -> int:
    """Number of distinct non-empty prefixes of `tokens_D`: the nodes of their trie.

    Examples:
        >>> prefix_tree_size([np.array([1, 2, 3]), np.array([1, 2, 4]), np.array([1])])
        4
    """
    order = _lexicographic_order(tokens_D)
    size, previous = 0, np.zeros(0, np.int64)
    for d in order:
        size += tokens_D[d].size - common_prefix_length(tokens_D[d], previous)
        previous = tokens_D[d]
    return size


def pack_prefix_tree(tokens_D: Sequence[np.ndarray]) -> PrefixTree:
    """Packs non-empty 1-D int sequences as one trie in pre-order (module docstring).

    Sequences are visited in lexicographic order; each adds the nodes past its longest common
    prefix with the previous one, and shares the previous one's columns before that. A
    node's subtree ends at the first later node that is not deeper.

    Args:
        tokens_D: `D` int 1-D arrays, each non-empty.

    Returns:
        `PrefixTree` with `N = prefix_tree_size(tokens_D)` nodes.

    Raises:
        ValueError: a sequence is empty or not 1-D (naming its index).

    Examples:
        >>> tree = pack_prefix_tree([np.array([5, 6, 7]), np.array([5, 6, 8]), np.array([9])])
        >>> tree.tokens_N.tolist(), tree.position_N.tolist(), tree.end_N.tolist()
        ([5, 6, 7, 8, 9], [0, 1, 2, 2, 0], [4, 4, 3, 4, 5])
        >>> [c.tolist() for c in tree.column_D]
        [[0, 1, 2], [0, 1, 3], [4]]
    """
    for d, tokens in enumerate(tokens_D):
        if tokens.ndim != 1 or tokens.size == 0:
            raise ValueError(
                f"pack_prefix_tree: tokens_D[{d}] must be non-empty 1-D, got shape {tokens.shape}"
            )
    tokens_parts: list[np.ndarray] = []
    position_parts: list[np.ndarray] = []
    column_D: list[np.ndarray] = [np.zeros(0, np.int64)] * len(tokens_D)
    previous_tokens, previous_columns = np.zeros(0, np.int64), np.zeros(0, np.int64)
    n = 0
    for d in _lexicographic_order(tokens_D):
        tokens = np.asarray(tokens_D[d], np.int64)
        shared = common_prefix_length(tokens, previous_tokens)
        new = tokens.size - shared
        tokens_parts.append(tokens[shared:])
        position_parts.append(np.arange(shared, tokens.size, dtype=np.int64))
        columns = np.concatenate([previous_columns[:shared], np.arange(n, n + new)])
        column_D[d] = columns
        n += new
        previous_tokens, previous_columns = tokens, columns
    position_N = np.concatenate(position_parts)
    return PrefixTree(
        tokens_N=np.concatenate(tokens_parts),
        position_N=position_N,
        end_N=_subtree_ends(position_N),
        column_D=tuple(column_D),
    )


def _subtree_ends(position_N: np.ndarray) -> np.ndarray:
    """For a pre-order row of node depths, the index of the first later node at a depth not
    below each node's (or `N`): where its subtree ends."""
    n = position_N.size
    end_N = np.full(n, n, np.int64)
    open_nodes: list[int] = []  # the current path, depths strictly increasing
    for i in range(n):
        while open_nodes and position_N[open_nodes[-1]] >= position_N[i]:
            end_N[open_nodes.pop()] = i
        open_nodes.append(i)
    return end_N


def _split_range(
    length_K: np.ndarray,
    lcp_K: list[int],
    size: Callable[[int, int], int],
    span: tuple[int, int],
    cap: int,
) -> list[tuple[int, int]]:
    """Cuts the sorted run `[lo, hi)` (lengths `length_K`, common prefixes with the previous
    `lcp_K`) into runs of at most `cap` trie nodes: a run too large splits where its adjacent
    common prefix is shortest (its root's children; a sequence that ends there, a prefix of
    the others, joins the next child), and neighbouring parts join while they fit."""
    lo, hi = span
    if hi - lo == 1 or size(lo, hi) <= cap:
        return [span]
    shortest = min(lcp_K[lo + 1 : hi])
    cuts = [k for k in range(lo + 1, hi) if lcp_K[k] == shortest]
    bounds = list(zip([lo, *cuts], [*cuts, hi], strict=True))
    while len(bounds) > 2 and bounds[0][1] - bounds[0][0] == 1 and length_K[lo] == shortest:
        bounds = [(bounds[0][0], bounds[1][1]), *bounds[2:]]
    out: list[tuple[int, int]] = []
    for sub in bounds:
        for piece in _split_range(length_K, lcp_K, size, sub, cap):
            if out and size(out[-1][0], piece[1]) <= cap:
                out[-1] = (out[-1][0], piece[1])  # neighbours that fit together stay together
            else:
                out.append(piece)
    return out


def group_prefix_rows(tokens_D: Sequence[np.ndarray], *, max_width: int) -> list[tuple[int, ...]]:
    """Cuts sequences into packed rows of at most `max_width` trie nodes each.

    The trie is cut into subtrees of at most `max_width` nodes (a subtree too large splits
    into its root's children, each keeping the shared prefix), which fill the rows
    first-fit-decreasing, so a group sharing a prompt is cut only when it does not fit a row
    alone and the rows stay full. A sequence longer than `max_width` gets a row of its own;
    a prefix shared across rows is packed in each.

    Args:
        tokens_D: `D` int 1-D arrays.
        max_width: the most nodes a row may hold (≥ 1); a longer sequence still gets a row.

    Returns:
        The rows, largest first, each a tuple of indices into `tokens_D` in lexicographic
        order.

    Examples:
        >>> seqs = [np.array([1, 2, 3]), np.array([4, 5]), np.array([1, 2, 4])]
        >>> group_prefix_rows(seqs, max_width=4)
        [(0, 2), (1,)]
        >>> group_prefix_rows(seqs, max_width=6)
        [(0, 2, 1)]
    """
    if max_width < 1:
        raise ValueError(f"group_prefix_rows: max_width must be at least 1, got {max_width}")
    if not tokens_D:
        return []
    order = _lexicographic_order(tokens_D)
    lcp_K = [0] + [
        common_prefix_length(tokens_D[order[k - 1]], tokens_D[order[k]])
        for k in range(1, len(order))
    ]
    length_K = np.array([tokens_D[d].size for d in order])
    new_K = length_K - np.array(lcp_K)
    new_cum = np.concatenate([[0], np.cumsum(new_K)])

    def size(lo: int, hi: int) -> int:
        return int(tokens_D[order[lo]].size + new_cum[hi] - new_cum[lo + 1])

    pieces = _split_range(length_K, lcp_K, size, (0, len(order)), max_width)
    pieces.sort(key=lambda span: (-size(*span), span[0]))
    rows: list[list[tuple[int, int]]] = []
    free: list[int] = []
    for span in pieces:
        need = size(*span)
        slot = next((r for r, room in enumerate(free) if room >= need), None)
        if slot is None:
            rows.append([span])
            free.append(max_width - need)
        else:
            rows[slot].append(span)
            free[slot] -= need
    return [tuple(order[k] for lo, hi in sorted(row) for k in range(lo, hi)) for row in rows]
