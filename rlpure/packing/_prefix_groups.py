"""Sequences grouped by a shared prefix: one prefix row per group, one suffix row per sequence.

The two-level layout of `rlpure.model.grouped_target_logprobs_fn` (Prefix Grouper's split): a
group's common prefix is computed once, in a prefix row of `prefix_width` positions, and each
of its sequences continues it in a suffix row of `suffix_width` positions.

Conventions:
- A group is a run of sequences adjacent in lexicographic order; its `prefix_length` is the
  longest common prefix of its sequences, capped at `prefix_width` (a group of one holds its
  sequence's first `min(length, prefix_width)` tokens). Each sequence's suffix, the tokens
  past `prefix_length`, must fit `suffix_width`.
- A run's common prefix only shrinks and its longest sequence only grows as it extends, so
  extending each group while it fits gives the fewest groups of any split into runs.
- Host-side numpy (memory movement, not maths).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec
import numpy as np

from rlpure.buckets import bucket_size
from rlpure.packing._prefix_tree import _lexicographic_order, common_prefix_length

__all__ = [
    "GroupedChunk",
    "GroupedPlan",
    "PrefixGroup",
    "SortedSequences",
    "group_shared_prefixes",
    "plan_grouped_chunks",
    "sort_sequences",
]


class PrefixGroup(msgspec.Struct, frozen=True, kw_only=True):
    """Sequences computed over one prefix row.

    Attributes:
        prefix_length: the tokens every sequence of the group shares and the prefix row holds.
        datums: the sequences' indices, in lexicographic order.
    """

    prefix_length: int
    datums: tuple[int, ...]


class SortedSequences(NamedTuple):
    """Sequences in lexicographic order (`sort_sequences`), for several groupings of them."""

    order_K: tuple[int, ...]
    """The sequences' indices, sorted."""
    lcp_K: tuple[int, ...]
    """Each sorted sequence's common prefix length with the one before it (0 for the first)."""
    length_K: tuple[int, ...]
    """Each sorted sequence's length."""


def sort_sequences(tokens_D: Sequence[np.ndarray]) -> SortedSequences:
    """`tokens_D` sorted lexicographically, with adjacent common prefixes and lengths.

    Examples:
        >>> sort_sequences([np.array([4, 5]), np.array([1, 2, 3]), np.array([1, 2])])
        SortedSequences(order_K=(2, 1, 0), lcp_K=(0, 2, 0), length_K=(2, 3, 2))
    """
    order = _lexicographic_order(tokens_D)
    lcp = [0] + [
        common_prefix_length(tokens_D[a], tokens_D[b]) for a, b in itertools.pairwise(order)
    ]
    return SortedSequences(
        order_K=tuple(order), lcp_K=tuple(lcp), length_K=tuple(tokens_D[d].size for d in order)
    )


def group_shared_prefixes(
    sequences: SortedSequences, *, prefix_width: int, suffix_width: int, max_datums: int
) -> list[PrefixGroup] | None:
    """Splits sorted sequences into the fewest runs of at most `max_datums` whose suffixes fit.

    Args:
        sequences: `sort_sequences` of the non-empty sequences.
        prefix_width: the positions of a prefix row (≥ 1).
        suffix_width: the positions of a suffix row (≥ 1).
        max_datums: the most sequences a group may hold (≥ 1).

    Returns:
        The groups in lexicographic order of their sequences, or None when a sequence is longer
        than `prefix_width + suffix_width` (it fits no group).

    Raises:
        ValueError: a width or `max_datums` is below 1.

    Examples:
        >>> seqs = sort_sequences([np.array([1, 2, 3]), np.array([4, 5]), np.array([1, 2, 4, 6])])
        >>> groups = group_shared_prefixes(seqs, prefix_width=4, suffix_width=2, max_datums=8)
        >>> [(g.prefix_length, g.datums) for g in groups]
        [(2, (0, 2)), (2, (1,))]
    """
    for name, value in (
        ("prefix_width", prefix_width),
        ("suffix_width", suffix_width),
        ("max_datums", max_datums),
    ):
        if value < 1:
            raise ValueError(f"group_shared_prefixes: {name} must be at least 1, got {value}")
    if max(sequences.length_K, default=0) > prefix_width + suffix_width:
        return None
    groups: list[PrefixGroup] = []
    members: list[int] = []
    shared = longest = 0
    for d, lcp, length in zip(*sequences, strict=True):
        if members:
            joined, widest = min(shared, lcp), max(longest, length)
            if len(members) < max_datums and widest - min(joined, prefix_width) <= suffix_width:
                members.append(d)
                shared, longest = joined, widest
                continue
            groups.append(
                PrefixGroup(prefix_length=min(shared, prefix_width), datums=tuple(members))
            )
        members, shared, longest = [d], length, length
    if members:
        groups.append(PrefixGroup(prefix_length=min(shared, prefix_width), datums=tuple(members)))
    return groups


class GroupedChunk(msgspec.Struct, frozen=True, kw_only=True):
    """One jitted training call on the grouped route: its groups' prefix and suffix rows."""

    groups: tuple[PrefixGroup, ...]

    @property
    def index_D(self) -> tuple[int, ...]:
        """The chunk's datums, group after group (suffix row `d` is the `d`-th)."""
        return tuple(d for group in self.groups for d in group.datums)


class GroupedPlan(msgspec.Struct, frozen=True, kw_only=True):
    """A call's grouped chunks, all padded to one shape (so one call loops over them)."""

    chunks: tuple[GroupedChunk, ...]
    prefix_rows: int
    """Prefix rows per chunk `P` (two sizes per doubling: 1, 2, 3, 4, 6, 8, 12, …)."""
    prefix_width: int
    """Prefix row width `S` (16, then four sizes per doubling)."""
    datums: int
    """Suffix (and datum) rows per chunk `D` (two sizes per doubling)."""
    suffix_width: int
    """Suffix row width `U` (4, 6, 8, 12, 16, … : two sizes per doubling)."""
    positions: int
    """Positions computed over all chunks: `chunks · (P · S + D · U)`."""
    key_reads: int
    """Query-key pairs the attention computes over all chunks: `chunks · (P S² + D U (S + U))`."""


def _assign_groups(sizes: list[int], n: int) -> list[list[int]]:
    """The indices of groups of `sizes` datums spread over `n` chunks: largest first onto the
    chunk holding the fewest datums (then the fewest groups, then the first such chunk);
    each chunk's indices in the order they were placed."""
    chunks: list[list[int]] = [[] for _ in range(n)]
    load = [(0, 0, c) for c in range(n)]  # (datums, groups, chunk): a heap
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        datums, count, slot = load[0]
        chunks[slot].append(k)
        heapq.heapreplace(load, (datums + sizes[k], count + 1, slot))
    return [chunk for chunk in chunks if chunk]


class _GroupLayout(NamedTuple):
    """Groups spread over chunks (`_layout`)."""

    chunks: list[list[PrefixGroup]]
    prefix_rows: int  # padded, per chunk
    datum_rows: int  # padded, per chunk


def _layout(groups: list[PrefixGroup], s: int, u: int, budget: int) -> _GroupLayout:
    """The chunks of `groups` at widths `s`, `u`: the fewest whose padded positions
    `P · s + D · u` fit `budget`.

    Each group must hold at most `_bucket_floor((budget − s) // u)` datums (so one group a
    chunk, padded, always fits)."""
    sizes = [len(g.datums) for g in groups]
    n = max(1, -(-(s * len(groups) + u * sum(sizes)) // budget))
    while True:
        chunks = _assign_groups(sizes, min(n, len(groups)))
        p = bucket_size(max(map(len, chunks)), steps_per_octave=2)
        d = bucket_size(max(sum(sizes[k] for k in c) for c in chunks), steps_per_octave=2)
        if p * s + d * u <= budget:  # each chunk's groups back in lexicographic order
            ordered = [[groups[k] for k in sorted(chunk)] for chunk in chunks]
            return _GroupLayout(chunks=ordered, prefix_rows=p, datum_rows=d)
        if n >= len(groups):
            raise ValueError(
                f"_layout: a group does not fit {budget} positions at widths {s} + {u}"
            )
        n += 1


def _bucket_floor(n: int) -> int:
    """The largest size of `bucket_size(·, steps_per_octave=2)` (1, 2, 3, 4, 6, 8, 12, …) at
    most `n ≥ 1`.

    Examples:
        >>> [_bucket_floor(n) for n in (1, 5, 6, 7, 23, 24)]
        [1, 4, 6, 6, 16, 24]
    """
    size = 1
    while (larger := bucket_size(size + 1, steps_per_octave=2)) <= n:
        size = larger
    return size


def plan_grouped_chunks(
    tokens_D: Sequence[np.ndarray],
    *,
    positions_for_keys: Callable[[int], int],
    key_weight: float,
) -> GroupedPlan | None:
    """Plans the grouped route: widths, groups and chunks of the least estimated cost.

    Every prefix width `S` (`bucket_size(·, minimum=16)`) and suffix width `U` (4, 6, 8, 12,
    …) up to the longest sequence's is tried: the sequences are grouped
    (`group_shared_prefixes`, at most as many per group as a chunk holds) and the groups
    spread over the fewest chunks whose padded positions fit `positions_for_keys(S + U)` (the
    memory budget at `S + U` keys a query). The cost is `positions + key_weight · key_reads`
    (every position pays the layers and the unembedding, every query-key pair the attention).

    Args:
        tokens_D: `D` int 1-D arrays, each non-empty.
        positions_for_keys: the most positions a chunk may compute when its queries read
            `keys` keys.
        key_weight: the cost of one query-key pair relative to one position's.

    Returns:
        The cheapest `GroupedPlan`, or None for no sequences or when no widths fit the budget
        (one datum of `S + U` positions over `positions_for_keys(S + U)`).

    Examples:
        >>> prompt = np.arange(100)
        >>> data = [np.concatenate([prompt, [200 + g] * 10]) for g in range(8)]
        >>> plan = plan_grouped_chunks(data, positions_for_keys=lambda k: 4096, key_weight=0.0)
        >>> plan.prefix_rows, plan.prefix_width, plan.datums, plan.suffix_width, plan.positions
        (1, 112, 8, 12, 208)
    """
    if not tokens_D:
        return None
    sequences = sort_sequences(tokens_D)
    longest = max(sequences.length_K)
    best: tuple[float, GroupedPlan] | None = None
    prefix_widths = _bucket_range(longest, minimum=16, steps_per_octave=4)
    for u in _bucket_range(longest, minimum=4, steps_per_octave=2):
        for s in prefix_widths:
            budget = positions_for_keys(s + u)
            if s + u < longest or s + u > budget:  # too short, or one datum over the budget
                continue
            groups = group_shared_prefixes(
                sequences,
                prefix_width=s,
                suffix_width=u,
                max_datums=_bucket_floor((budget - s) // u),
            )
            assert groups is not None  # s + u covers the longest sequence
            layout = _layout(groups, s, u, budget)
            n, p, d = len(layout.chunks), layout.prefix_rows, layout.datum_rows
            plan = GroupedPlan(
                chunks=tuple(GroupedChunk(groups=tuple(c)) for c in layout.chunks),
                prefix_rows=p,
                prefix_width=s,
                datums=d,
                suffix_width=u,
                positions=n * (p * s + d * u),
                key_reads=n * (p * s * s + d * u * (s + u)),
            )
            cost = plan.positions + key_weight * plan.key_reads
            if best is None or cost < best[0]:
                best = (cost, plan)
    return None if best is None else best[1]


def _bucket_range(longest: int, *, minimum: int, steps_per_octave: int) -> list[int]:
    """The bucket sizes from `minimum` up to the bucket of `longest`."""
    top = bucket_size(longest, minimum=minimum, steps_per_octave=steps_per_octave)
    sizes = [minimum]
    while sizes[-1] < top:
        sizes.append(bucket_size(sizes[-1] + 1, minimum=minimum, steps_per_octave=steps_per_octave))
    return sizes
