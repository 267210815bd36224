"""How a `forward_backward` batch is cut into jitted calls (`shell.local._inputs.plan_chunks`).

The toy model trained slowly on long multi-turn datums (issue 14: 80 datums × ~970 tokens in
79 s) because the batch was padded to a power-of-two row count and the row chunks ran over
those padding rows too (80 datums → 128 rows → 16 calls of 8, six of them padding only), and
every datum was padded to the longest one's power-of-two length (attention is quadratic in
it). These pin the new plan: no padding-only call, each chunk padded to its own length bucket.
"""

from __future__ import annotations

import numpy as np

from shell.local._inputs import length_bucket, plan_chunks


def test_no_chunk_is_padding_only() -> None:
    lengths = np.random.default_rng(0).integers(900, 1001, 80)
    chunks = plan_chunks(lengths, rows_for_width=lambda width: 8)
    assert len(chunks) == 10  # 80 / 8, not 128 / 8
    assert all(c.rows == 8 and len(c.index_D) == 8 and c.width == 1024 for c in chunks)
    assert sorted(d for c in chunks for d in c.index_D) == list(range(80))


def test_each_chunk_is_padded_to_its_own_length_bucket() -> None:
    lengths = np.array([20, 1000, 30, 990, 25, 5])
    chunks = plan_chunks(lengths, rows_for_width=lambda width: 2)
    assert [(c.index_D, c.width) for c in chunks] == [((1, 3), 1024), ((2, 4), 32), ((0, 5), 24)]
    # a last partial chunk pads its rows to a power of two, within the budget
    (partial,) = plan_chunks(np.array([7, 7, 7]), rows_for_width=lambda width: 64)
    assert partial.rows == 8 and len(partial.index_D) == 3


def test_length_buckets_waste_at_most_half() -> None:
    for n in range(1, 4097):
        assert n <= length_bucket(n) <= max(16, 1.5 * n)
