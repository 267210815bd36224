"""Differential test against tinker-cookbook 0.6.1: `rlpure.corrections.kl_estimate`'s k1 and
k2 masked means are the cookbook's `optim/kl_sample_train_v1` and `_v2`
(`rl/metrics.compute_kl_sample_train`) on the same arrays — the sampler's logprobs as π, the
trainer's as the reference, the action mask as the mask. Needs the cookbook (`make parity`).
"""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.corrections import kl_estimate
from tests.parity.porting import require_cookbook

require_cookbook()

import torch  # noqa: E402
from tinker_cookbook.rl.metrics import compute_kl_sample_train  # noqa: E402


@st.composite
def ragged_logprobs(draw):
    """Per datum: sampler and trainer logprobs and a 0/1 action mask of a random length; the
    batch has at least one action token (the cookbook asserts)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    num = draw(st.integers(1, 5))
    rows = []
    for _ in range(num):
        length = int(rng.integers(1, 9))
        mask = (rng.uniform(size=length) < 0.6).astype(np.float32)
        sampler = rng.uniform(-5.0, 0.0, length).astype(np.float32)
        trainer = (sampler + rng.normal(scale=0.7, size=length)).astype(np.float32)
        rows.append((sampler, trainer, mask))
    if not any(mask.any() for _, _, mask in rows):
        rows[0][2][0] = 1.0
    return rows


def _padded(rows, index):
    width = max(row[0].shape[0] for row in rows)
    out = np.zeros((len(rows), width), np.float32)
    for d, row in enumerate(rows):
        out[d, : row[index].shape[0]] = row[index]
    return out


@settings(max_examples=60, deadline=None)
@given(ragged_logprobs())
def test_k1_and_k2_means_are_the_cookbooks_kl_sample_train(rows):
    data_D = [
        tinker.Datum(
            model_input=tinker.ModelInput.from_ints([0] * sampler.shape[0]),
            loss_fn_inputs={
                "logprobs": tinker.TensorData.from_numpy(sampler),
                "mask": tinker.TensorData.from_numpy(mask),
            },
        )
        for sampler, _, mask in rows
    ]
    cookbook = compute_kl_sample_train(data_D, [torch.from_numpy(t) for _, t, _ in rows])
    sampler_D_T, trainer_D_T, mask_D_T = (_padded(rows, i) for i in range(3))
    k1 = kl_estimate(sampler_D_T, trainer_D_T, mask_D_T, estimator="k1").mean
    k2 = kl_estimate(sampler_D_T, trainer_D_T, mask_D_T, estimator="k2").mean
    assert float(k1) == pytest.approx(cookbook["optim/kl_sample_train_v1"], rel=1e-5, abs=1e-6)
    assert float(k2) == pytest.approx(cookbook["optim/kl_sample_train_v2"], rel=1e-5, abs=1e-6)
